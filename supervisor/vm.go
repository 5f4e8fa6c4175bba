package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/observe/events"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// VM is a handle on one VM by name: the Supervisor's per-VM methods
// without repeating the name. It holds nothing open.
type VM struct {
	s    *Supervisor
	name string
}

// VM returns a handle on the VM called name (it need not exist yet).
func (s *Supervisor) VM(name string) *VM { return &VM{s: s, name: name} }

// Name is the VM's name.
func (v *VM) Name() string { return v.name }

// Status is Supervisor.Status.
func (v *VM) Status(ctx context.Context) (Status, error) { return v.s.Status(ctx, v.name) }

// Pause is Supervisor.Pause.
func (v *VM) Pause(ctx context.Context) error { return v.s.Pause(ctx, v.name) }

// Resume is Supervisor.Resume.
func (v *VM) Resume(ctx context.Context) error { return v.s.Resume(ctx, v.name) }

// Down is Supervisor.DownWith.
func (v *VM) Down(ctx context.Context, o DownOptions) (DownResult, error) {
	return v.s.DownWith(ctx, v.name, o)
}

// Reboot is Supervisor.Reboot.
func (v *VM) Reboot(ctx context.Context, mode RebootMode) (RebootResult, error) {
	return v.s.Reboot(ctx, v.name, mode)
}

// Events is Supervisor.Events.
func (v *VM) Events(ctx context.Context) (<-chan Event, error) { return v.s.Events(ctx, v.name) }

// EventsSince is Supervisor.EventsSince.
func (v *VM) EventsSince(ctx context.Context, since time.Time) (<-chan Event, error) {
	return v.s.EventsSince(ctx, v.name, since)
}

// WaitState is Supervisor.WaitState.
func (v *VM) WaitState(ctx context.Context, want State) (Status, error) {
	return v.s.WaitState(ctx, v.name, want)
}

// Monitor is Supervisor.Monitor.
func (v *VM) Monitor(ctx context.Context) (*qmp.Conn, func(), error) { return v.s.Monitor(ctx, v.name) }

// Sockets is Supervisor.Sockets.
func (v *VM) Sockets() Sockets { return v.s.Sockets(v.name) }

// Sockets are where a running VM's QEMU listens, as vmsup made them.
type Sockets struct {
	QMP        string // command monitor: one client at a time (Monitor takes turns)
	Events     string // event monitor, for long-lived watchers (Events)
	Console    string // serial console
	ConsoleLog string // everything the guest wrote on its console (this run)
	Agent      string // the guest agent's channel
}

// Sockets returns the VM's socket paths (under Root/vms/NAME).
func (s *Supervisor) Sockets(name string) Sockets {
	p := s.env.Paths(name)
	return Sockets{QMP: p.QMP, Events: p.Events, Console: p.Console, ConsoleLog: p.ConsoleLog, Agent: p.Agent}
}

// Monitor opens a typed QMP session on the VM's command monitor, taking
// its turn with vmsup's own commands; release ends it. Commands sent
// here bypass the raw-QMP policy and audit log of Supervisor.QMP: the
// caller is a program with root's rights over the VM.
func (s *Supervisor) Monitor(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	if err := spec.ValidName(name); err != nil {
		return nil, nil, vmerr.Wrap(name, err)
	}
	return s.env.QMPSession(ctx, name)
}

// Event is something QEMU reported about a running VM, or a lifecycle
// event of vmsup's (vmevents).
type Event = events.Event

// Events streams the VM's events from now on (QEMU's and vmsup's) until ctx
// ends or the VM's QEMU ends (then the channel closes). It reads the event
// log and history (FollowEvents), so any number of callers can listen.
func (s *Supervisor) Events(ctx context.Context, name string) (<-chan Event, error) {
	return s.EventsSince(ctx, name, time.Now())
}

// EventsSince is Events from since on: what happened before the call comes
// first, so a caller that starts the VM and then subscribes gets its
// "started" event. Only the end of the QEMU running now closes the
// channel, not that of an earlier run since then.
func (s *Supervisor) EventsSince(ctx context.Context, name string, since time.Time) (<-chan Event, error) {
	return events.Stream(ctx, s.env, name, since)
}

// WaitState waits until the VM is in state want (polling its status,
// which asks systemd and QEMU), and returns that status. A VM that ends
// up crashed while waiting for another state is an error.
func (s *Supervisor) WaitState(ctx context.Context, name string, want State) (Status, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := s.status(ctx, name, false)
		switch {
		case err != nil && !(want == StateShutOff && errors.Is(err, ErrNotFound)):
			return st, err
		case st.State == want || err != nil:
			return st, nil
		case st.State == StateCrashed:
			return st, vmerr.Wrap(name, fmt.Errorf("crashed (%s) while waiting for %s", st.Reason, want))
		}
		select {
		case <-ctx.Done():
			return st, vmerr.Wrap(name, fmt.Errorf("still %s, not %s: %w", st.State, want, ctx.Err()))
		case <-tick.C:
		}
	}
}

// GuestPing is Supervisor.GuestPing.
func (v *VM) GuestPing(ctx context.Context) (AgentStatus, error) { return v.s.GuestPing(ctx, v.name) }
