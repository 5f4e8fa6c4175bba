package iohealth

import (
	"fmt"
	"time"

	"github.com/vmsup/vmsup/qmp"
)

// State is a VM's disk I/O as a Detector judges it.
type State int

// States, from best to worst: a VM's health is its worst disk's.
const (
	OK      State = iota
	Stalled       // requests in flight, none ended for the bound
	Failing       // requests fail, or an I/O error stopped the guest
)

func (s State) String() string {
	switch s {
	case OK:
		return "ok"
	case Stalled:
		return "stalled"
	case Failing:
		return "failing"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// MarshalText writes the name (a fleet status carries it).
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a name; one it does not know is OK.
func (s *State) UnmarshalText(b []byte) error {
	*s = OK
	for _, c := range []State{Stalled, Failing} {
		if c.String() == string(b) {
			*s = c
		}
	}
	return nil
}

// Health is the verdict on a VM's disks: the worst disk's state and why.
// Reason stays the same while the state lasts (a status that carries it
// is not rewritten at each sample).
type Health struct {
	State  State
	Disk   string    // the disk it is about ("" when OK)
	Since  time.Time // since when (stalled: no request ended since)
	Reason string    // one line
}

// DefaultBound is how long requests may stay in flight with none ending
// before a disk counts as stalled: far above any healthy latency, well
// inside what an operator waits before calling storage dead.
const DefaultBound = 5 * time.Second

// Detector judges a VM's samples over time; feed it every sample of one
// VM, in order. The zero value uses DefaultBound.
type Detector struct {
	Bound time.Duration

	disks map[string]*track
}

// track is what a Detector remembers of one disk.
type track struct {
	at         time.Time // the last sample
	ended      uint64
	failed     uint64
	inFlight   int
	stuckSince time.Time // requests in flight and none ended since; zero: not stuck
	failedAt   time.Time // the last sample that saw new failures
}

// Observe judges s against the samples before it.
func (d *Detector) Observe(s Sample) Health {
	bound := d.Bound
	if bound <= 0 {
		bound = DefaultBound
	}
	if d.disks == nil {
		d.disks = map[string]*track{}
	}
	seen := map[string]bool{}
	worst := Health{State: OK}
	for _, disk := range s.Disks {
		seen[disk.Name] = true
		t, known := d.disks[disk.Name]
		if !known || disk.Ended < t.ended { // new, or a new QEMU
			t = &track{ended: disk.Ended, failed: disk.Failed}
			d.disks[disk.Name] = t
		}
		h := t.observe(s.At, disk, bound, known)
		if h.State > worst.State {
			worst = h
		}
	}
	for name := range d.disks {
		if !seen[name] {
			delete(d.disks, name) // hot-unplugged
		}
	}
	return worst
}

// observe updates the disk's track with one sample and judges it. A
// request is only counted stuck from the first sample that saw requests in
// flight with none ended since the sample before, so a request sent after
// a long idle spell is not taken for a stall (QEMU's idle time counts from
// the last request that ended, not from the oldest one waiting).
func (t *track) observe(at time.Time, d Disk, bound time.Duration, known bool) Health {
	progress := !known || d.Ended != t.ended
	switch {
	case d.InFlight <= 0 || progress:
		t.stuckSince = time.Time{}
	case t.stuckSince.IsZero() && t.inFlight > 0:
		t.stuckSince = t.at // in flight then, nothing ended since
	case t.stuckSince.IsZero():
		t.stuckSince = at
	}
	if known && d.Failed > t.failed {
		t.failedAt = at
	}
	t.at, t.ended, t.failed, t.inFlight = at, d.Ended, d.Failed, d.InFlight
	switch {
	case d.IOStatus == qmp.IOStatusFailed || d.IOStatus == qmp.IOStatusNoSpace:
		return Health{State: Failing, Disk: d.Name, Since: at, Reason: fmt.Sprintf("disk %s: an I/O error stopped the guest (io-status %s)", d.Name, d.IOStatus)}
	case !t.failedAt.IsZero() && at.Sub(t.failedAt) < bound:
		return Health{State: Failing, Disk: d.Name, Since: t.failedAt, Reason: fmt.Sprintf("disk %s: requests fail", d.Name)}
	case !t.stuckSince.IsZero() && at.Sub(t.stuckSince) >= bound:
		return Health{State: Stalled, Disk: d.Name, Since: t.stuckSince, Reason: fmt.Sprintf("disk %s: requests in flight, none ended since %s (storage unreachable?)",
			d.Name, t.stuckSince.UTC().Format("15:04:05Z"))}
	}
	return Health{State: OK}
}
