// Package vmstatus reports what vmsup knows of its VMs (vmsup status, ls):
// each VM's state from its systemd unit and, while QEMU runs, from QMP,
// with what its running view (vmstore.View), its file and its UEFI
// variable store say. It only reads, but for settling what a killed command
// left (the Env's operation kernel) so that status tells the truth. It does
// not own the figures of vmsup stats (internal/observe/stats) nor the VM's
// devices' host side (the network, confinement): the machine.Env gives those.
package status

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/guestagent"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// seam is what status asks systemd and QEMU: the units, a VM's QMP session
// and guest agent, and what confines its unit. envSeam, over the Env, is
// the one implementation; the tests fake it.
type seam interface {
	Systemd(ctx context.Context) (Systemd, error)
	// Monitor opens the VM's QMP session, one client at a time (release
	// when done).
	Monitor(ctx context.Context, name string) (m Monitor, release func(), err error)
	// GuestPing asks the VM's guest agent, in a session of its own.
	GuestPing(ctx context.Context, name string) (guestagent.AgentStatus, error)
	// Confinement is what confines the running VM; detail measures the
	// unit's exposure too.
	Confinement(ctx context.Context, name, unit string, mainPID uint32, detail bool) *confine.Status
}

// Systemd is what status asks systemd (a *units.Manager).
type Systemd interface {
	Status(ctx context.Context, unit string) (units.Status, error)
	List(ctx context.Context, patterns ...string) ([]units.Status, error)
}

// Monitor is a running VM's QMP session as status uses it.
type Monitor interface {
	QueryStatus(ctx context.Context) (qmp.StatusInfo, error)
	// PingAgent asks the guest agent over this session.
	PingAgent(ctx context.Context) (guestagent.AgentStatus, error)
}

// Options tune a Reader.
type Options struct {
	// StartGrace is how long after its unit started a QEMU that does not
	// answer on QMP yet counts as starting, not unknown.
	StartGrace time.Duration
}

// Reader reads the status of an Env's VMs.
type Reader struct {
	env *machine.Env
	o   Options
	sys seam
}

// New returns a status reader over env.
func New(env *machine.Env, o Options) *Reader { return &Reader{env: env, o: o, sys: envSeam{env}} }

// Status reports the VM's state from systemd and, while it runs, QMP.
// detail says whether to measure the unit's exposure (a systemd-analyze
// run) and ping the guest agent, both left out of List.
func (r *Reader) Status(ctx context.Context, name string, detail bool) (Status, error) {
	if err := spec.ValidName(name); err != nil {
		return Status{}, vmerr.Wrap(name, err)
	}
	if err := vmstore.NotVM(name); err != nil {
		return Status{}, err
	}
	sd, err := r.sys.Systemd(ctx)
	if err != nil {
		return Status{}, err
	}
	// What a killed command left is settled first, so that status tells
	// the truth (unless a command is at work on the VM now).
	recovered, recErr := r.env.Ops().SettleIfFree(ctx, name)
	store := r.env.State()
	unit := store.UnitOf(name)
	st, err := sd.Status(ctx, unit)
	if err != nil {
		return Status{}, err
	}
	p := store.Paths(name)
	out := Status{Name: name, Unit: unit, StateDir: p.Dir, Console: p.Console, ConsoleLog: p.ConsoleLog, Autostart: r.env.AutostartMarks().IsEnabled(name)}
	out.Recovery = recovered
	if recErr != nil {
		out.Recovery = recErr.Error()
	}
	v, _ := store.View(name)
	recorded(&out, p, v)
	out.Disks, out.NICs = r.devices(ctx, name, v)
	if v != nil && st.Exists && st.ActiveState == "active" { // live resizes hold for this run
		out.CPUs, out.Memory = v.Spec.CPUs, v.Spec.Memory.String()
	}
	if st.Stopped() {
		if _, err := os.Stat(p.Dir); errors.Is(err, os.ErrNotExist) {
			return out, r.env.NotFound(name)
		}
		out.State, out.Reason = StateShutOff, r.env.EndedReason(name)
		return out, nil
	}
	if r.unitStatus(&out, st) {
		return out, nil
	}
	out.Confinement = r.sys.Confinement(ctx, name, unit, st.MainPID, detail)
	r.qemuStatus(ctx, &out, st, v, detail)
	return out, nil
}

// unitStatus fills what systemd says of the VM's unit, which has a
// process, and reports whether that settles the VM's state (no QEMU to ask).
func (r *Reader) unitStatus(out *Status, st units.Status) bool {
	out.UnitState = st.ActiveState + "/" + st.SubState
	out.MainPID = st.MainPID
	out.MemoryUsed = st.MemoryCurrent
	if !st.Since.IsZero() {
		t := st.Since
		out.Since = &t
	}
	switch st.ActiveState {
	case "failed":
		out.State, out.Reason = StateCrashed, st.ExitReason()
		return true
	case "activating":
		out.State = StateStarting
		return true
	case "deactivating":
		out.State = StateStopping
		return true
	}
	return false
}

// qemuStatus fills what the VM's QEMU says over QMP: its run state, the
// file's sync, and (detail) the guest agent's ping.
func (r *Reader) qemuStatus(ctx context.Context, out *Status, st units.Status, v *vmstore.View, detail bool) {
	m, release, err := r.sys.Monitor(ctx, out.Name)
	if err != nil {
		out.State, out.Reason = StateUnknown, err.Error()
		if time.Since(st.Since) < r.o.StartGrace {
			// QEMU has not opened its monitor yet.
			out.State, out.Reason = StateStarting, ""
		}
		return
	}
	defer release()
	qs, err := m.QueryStatus(ctx)
	if err != nil {
		out.State, out.Reason = StateUnknown, err.Error()
		return
	}
	out.QEMUStatus = string(qs.Status)
	if v != nil {
		r.fileStatus(out, v)
	}
	out.State, out.Reason = QEMUState(qs)
	if out.Since != nil && (out.State == StateRunning || out.State == StatePaused) {
		out.UptimeSeconds = int64(time.Since(*out.Since).Seconds())
	}
	if detail {
		out.DiskIO = diskIO(ctx, m)
	}
	if qs.Running && detail {
		if a, err := m.PingAgent(ctx); err == nil {
			out.GuestAgent = &a
		}
	}
}

// diskIO judges one sample of the VM's disk I/O, where the session can
// take one ("" otherwise).
func diskIO(ctx context.Context, m Monitor) string {
	im, ok := m.(iohealth.Monitor)
	if !ok {
		return ""
	}
	s, err := iohealth.Read(ctx, im)
	if err != nil {
		return ""
	}
	for _, d := range s.Disks {
		switch {
		case d.IOStatus == qmp.IOStatusFailed || d.IOStatus == qmp.IOStatusNoSpace:
			return fmt.Sprintf("failing: disk %s: an I/O error stopped the guest (io-status %s)", d.Name, d.IOStatus)
		case iohealth.StalledNow(d, iohealth.DefaultBound):
			return fmt.Sprintf("stalled: disk %s: %d requests in flight, none ended for %s (storage unreachable?)", d.Name, d.InFlight, d.Idle.Round(time.Second))
		}
	}
	return "ok"
}

// List reports every VM vmsup knows: those with a state directory and those
// with a vmsup unit (even if their directory is gone).
func (r *Reader) List(ctx context.Context) ([]Status, error) {
	names, err := r.env.State().Known()
	if err != nil {
		return nil, err
	}
	sd, err := r.sys.Systemd(ctx)
	if err != nil {
		return nil, err
	}
	us, err := sd.List(ctx, "vmsup-*.service")
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	for _, u := range us {
		// A unit is a VM's when vmsup made it for one (its description
		// says so), not by its name: vmsup-api.service is not a VM.
		n := strings.TrimSuffix(strings.TrimPrefix(u.Name, "vmsup-"), ".service")
		if spec.ValidName(n) == nil && u.Description == vmstore.UnitDescription(n) {
			set[n] = true
		}
	}
	all := make([]string, 0, len(set))
	for n := range set {
		all = append(all, n)
	}
	sort.Strings(all)
	out := make([]Status, 0, len(all))
	for _, n := range all {
		st, err := r.Status(ctx, n, false)
		if err != nil && !errors.Is(err, vmstore.ErrNotFound) {
			return nil, err
		}
		if err == nil {
			if st.State == StateRunning {
				// The guest's addresses, when its agent answers (at once
				// if the guest has not opened the channel).
				if a, err := r.sys.GuestPing(ctx, n); err == nil && a.Responding {
					st.GuestAgent = &a
				}
			}
			out = append(out, st)
		}
	}
	return out, nil
}
