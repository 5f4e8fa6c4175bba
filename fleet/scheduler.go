package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/vmsup/vmsup/spec"
)

// Scheduler places VMs: one pass reads the fleet, decides, and commits
// each decision as a compare-and-swap on the placement key, so exactly one
// decision wins even if two schedulers ever ran (the election makes one).
type Scheduler struct {
	Store *Store
	Log   *slog.Logger
	// Fence cuts a lost host off the shared disks of a VM before the VM
	// is restarted elsewhere (nil: VMs of lost hosts are never restarted).
	Fence Fencer
	// Decided, when set, gets how long each first placement took, from
	// the choice to the committed transaction (a pass reads the fleet once
	// for all its decisions): the figures.
	Decided func(vm string, d time.Duration)
	// Hold, when set, is the time before which no host is failed over:
	// this agent told a peer that etcd did not answer it (fleet/hold.go).
	Hold func() time.Time
	// FailoverStalled, when positive, restarts elsewhere (after fencing
	// its host) a VM whose host has reported its disk I/O stalled for that
	// long; 0: stalled VMs are only reported.
	FailoverStalled time.Duration

	// guard holds while this scheduler leads (its election key exists):
	// every decision commits only with it, and a failover checks it before
	// fencing, so a scheduler that lost its election (its session expired
	// while etcd had no quorum, say) decides nothing. nil: no election.
	guard []clientv3.Cmp
}

// leads makes the scheduler's decisions conditional on el's leadership.
func (s *Scheduler) leads(el *concurrency.Election) {
	s.guard = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())}
}

// errNotLeader ends a pass of a scheduler that lost its election.
var errNotLeader = errors.New("this agent no longer leads the scheduling (its election key is gone)")

// Fencer fences a lost host from one VM's shared disks (Ceph: blocklist
// its clients, take over the RBD locks); an error leaves the VM where it is.
type Fencer interface {
	Fence(ctx context.Context, lost string, vm *spec.VM) error
}

// errRaced ends a pass whose compare-and-swap lost to another writer.
var errRaced = errors.New("the fleet changed during the pass; the next pass reads it again")

// Pass runs one scheduling pass over a fresh read of the fleet.
func (s *Scheduler) Pass(ctx context.Context) error {
	snap, err := s.Store.Load(ctx, false)
	if err != nil {
		return err
	}
	hosts := slices.Collect(maps.Values(snap.Hosts))
	slices.SortFunc(hosts, func(a, b Host) int { return cmpString(a.Name, b.Name) })
	loads := loadsOf(snap)
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(snap.VMs)) {
		rec := snap.VMs[name]
		f, perr := spec.Parse(rec.Value.File, []byte(rec.Value.TOML))
		p, placed := snap.Placements[name]
		var err error
		switch {
		case perr != nil:
			// (apply validates; a spec stored by an older vmsup may not parse)
			err = s.status(ctx, snap, name, Status{State: StateInvalid, Reason: perr.Error()})
		case !placed:
			err = s.placeNew(ctx, snap, rec, f, hosts, &loads)
		case !alive(snap, p.Value.Host):
			err = s.failover(ctx, snap, rec, p, f, hosts, &loads)
		case snap.Cordoned[p.Value.Host] && p.Value.Target == "":
			err = s.drain(ctx, snap, p, f, hosts, &loads)
		case p.Value.Target != "" && !alive(snap, p.Value.Target):
			// The drain's target died: the VM stays, the next pass picks again.
			next := p.Value
			next.Target, next.FailedTargets = "", appendNew(next.FailedTargets, p.Value.Target)
			_, err = s.Store.movePlacement(ctx, name, p.Rev, next, nil, s.guard)
		case s.stalledLongEnough(snap.Statuses[name].Value, p.Value.Host):
			err = s.evacuate(ctx, snap, rec, p, f, hosts, &loads)
		}
		errs = append(errs, err)
		if errors.Is(err, errRaced) || errors.Is(err, errNotLeader) {
			// Every later decision here would rest on a stale read, or is
			// not this scheduler's to make: the next pass reads again.
			break
		}
	}
	return errors.Join(errs...)
}

// placeNew places an unplaced VM on the host Choose picks; errRaced if the
// fleet changed since the read (or this scheduler lost its election).
func (s *Scheduler) placeNew(ctx context.Context, snap *Snapshot, rec Entry[VMRecord], f *spec.File, hosts []Host, loads *[]Load) error {
	name := rec.Value.Name
	t0 := time.Now()
	host, err := Choose(RequestOfRecord(rec.Value, &f.VM), hosts, *loads)
	if err != nil {
		return s.unschedulable(ctx, snap, name, "", err)
	}
	ok, err := s.Store.place(ctx, rec, host, s.guard)
	if err != nil || !ok {
		return cmp.Or(err, errRaced)
	}
	*loads = append(*loads, Load{Request: RequestOf(&f.VM), Host: host})
	if s.Decided != nil {
		s.Decided(name, time.Since(t0))
	}
	s.log().Info("placed", "vm", name, "host", host)
	return nil
}

// drain gives a VM on a cordoned host a target to migrate to.
func (s *Scheduler) drain(ctx context.Context, snap *Snapshot, p Entry[Placement], f *spec.File, hosts []Host, loads *[]Load) error {
	name := f.VM.Name
	// Not where a migration failed, unless no other host fits.
	r := RequestOfRecord(snap.VMs[name].Value, &f.VM)
	target, err := Choose(r, hosts, *loads, append([]string{p.Value.Host}, p.Value.FailedTargets...)...)
	if err != nil && len(p.Value.FailedTargets) > 0 {
		target, err = Choose(r, hosts, *loads, p.Value.Host)
	}
	if err != nil {
		return s.unschedulable(ctx, snap, name, p.Value.Host, err)
	}
	next := p.Value
	next.Target = target
	ok, err := s.Store.movePlacement(ctx, name, p.Rev, next, &Status{Host: p.Value.Host, State: StateMigrating, Reason: "drain: to " + target}, s.guard)
	if err != nil || !ok {
		return err
	}
	*loads = append(*loads, Load{Request: RequestOf(&f.VM), Host: target})
	s.log().Info("drain", "vm", name, "from", p.Value.Host, "to", target)
	return nil
}

func (s *Scheduler) holdUntil() time.Time {
	if s.Hold == nil {
		return time.Time{}
	}
	return s.Hold()
}

// appendNew appends v to list (a copy) unless it is there.
func appendNew(list []string, v string) []string {
	if slices.Contains(list, v) {
		return list
	}
	return append(slices.Clone(list), v)
}

func (s *Scheduler) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func alive(snap *Snapshot, host string) bool { _, ok := snap.Hosts[host]; return ok }

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// loadsOf is what every placed VM takes: on its host, and on its drain
// target as well while it moves.
func loadsOf(snap *Snapshot) []Load {
	var loads []Load
	for name, p := range snap.Placements {
		rec, ok := snap.VMs[name]
		if !ok {
			continue
		}
		f, err := spec.Parse(rec.Value.File, []byte(rec.Value.TOML))
		if err != nil {
			continue
		}
		r := RequestOf(&f.VM)
		loads = append(loads, Load{Request: r, Host: p.Value.Host})
		if p.Value.Target != "" {
			loads = append(loads, Load{Request: r, Host: p.Value.Target})
		}
	}
	return loads
}

// status writes st unless the stored status already says the same.
func (s *Scheduler) status(ctx context.Context, snap *Snapshot, name string, st Status) error {
	if cur, ok := snap.Statuses[name]; ok && cur.Value.State == st.State && cur.Value.Reason == st.Reason && cur.Value.Host == st.Host {
		return nil
	}
	return s.Store.PutStatus(ctx, name, st)
}

func (s *Scheduler) unschedulable(ctx context.Context, snap *Snapshot, name, host string, err error) error {
	var u *Unschedulable
	if !errors.As(err, &u) {
		return err
	}
	if host != "" { // a drain that finds no target: the VM runs on
		cur := snap.Statuses[name].Value
		cur.Reason = "drain: " + u.Reason
		return s.status(ctx, snap, name, cur)
	}
	return s.status(ctx, snap, name, Status{State: StateUnschedulable, Reason: u.Reason})
}

// failover restarts a lost host's VM elsewhere, only when every writable
// disk is on storage vmsup can fence (RBD), and only after fencing.
func (s *Scheduler) failover(ctx context.Context, snap *Snapshot, rec Entry[VMRecord], p Entry[Placement], f *spec.File, hosts []Host, loads *[]Load) error {
	name, lost := rec.Value.Name, p.Value.Host
	if why := LocalDisk(&f.VM); why != "" {
		return s.status(ctx, snap, name, Status{Host: lost, State: StateLost,
			Reason: fmt.Sprintf("host %s is down (its lease expired); not restarted elsewhere: %s", lost, why)})
	}
	if s.Fence == nil {
		return s.status(ctx, snap, name, Status{Host: lost, State: StateLost, Reason: fmt.Sprintf("host %s is down; no fencing configured, so not restarted elsewhere", lost)})
	}
	target, err := Choose(RequestOfRecord(rec.Value, &f.VM), hosts, *loads, lost)
	if err != nil {
		return s.unschedulable(ctx, snap, name, "", err)
	}
	// Held: a peer that was cut off from etcd was promised no failover;
	// by the end of the promise it has fenced itself.
	if until := s.holdUntil(); time.Now().Before(until) {
		return s.status(ctx, snap, name, Status{Host: lost, State: StateLost,
			Reason: fmt.Sprintf("host %s is down (its lease expired); failover held until %s (etcd was unreachable for every host)", lost, until.UTC().Format("15:04:05Z"))})
	}
	// Fencing cannot be undone: only the leader does it.
	if ok, err := s.Store.cas(ctx, nil, s.guard); err != nil || !ok {
		return errors.Join(err, errNotLeader)
	}
	if err := s.Fence.Fence(ctx, lost, &f.VM); err != nil {
		return s.status(ctx, snap, name, Status{Host: lost, State: StateLost, Reason: fmt.Sprintf("host %s is down; fencing it failed, so not restarted: %v", lost, err)})
	}
	if time.Now().Before(s.holdUntil()) {
		return nil // promised while fencing: the next pass decides
	}
	next := Placement{Host: target, Epoch: p.Value.Epoch + 1}
	ok, err := s.Store.movePlacement(ctx, name, p.Rev, next, &Status{Host: target, State: StatePending, Reason: fmt.Sprintf("failover from %s (fenced)", lost)}, s.guard)
	if err == nil && ok {
		*loads = append(*loads, Load{Request: RequestOf(&f.VM), Host: target})
		s.log().Info("failover", "vm", name, "from", lost, "to", target)
	}
	return err
}

// LocalDisk names the first writable disk a failover could not take along
// (anything but RBD, which vmsup fences); "" if there is none. Read-only
// CD-ROMs and seeds are rebuilt or found on any host.
func LocalDisk(vm *spec.VM) string {
	for _, d := range vm.Disks {
		if d.ReadOnly || d.Type == spec.DiskRBD {
			continue
		}
		if d.Type == spec.DiskISCSI {
			return fmt.Sprintf("disk %s is iSCSI, which vmsup cannot fence", d.Name)
		}
		return fmt.Sprintf("disk %s is a %s on the host's own storage", d.Name, d.Type)
	}
	return ""
}
