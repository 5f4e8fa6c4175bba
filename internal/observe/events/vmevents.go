// Package vmevents reads the VMs' events (vmsup events, Supervisor.Events)
// without a resident process: QEMU writes its events to its event log with
// no client (qemuargs.Options.EventLog); when a QEMU ends, its stop-post
// hook moves them into the VM's history (internal/vm/eventlog), where vmsup
// also writes its lifecycle events. Readers read files: any number at
// once, beside vmsup's own commands (which keep the event socket), and
// nothing is lost while none runs. Writing the history is the supervisor's.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Lifecycle events vmsup writes (eventlog's).
const (
	Started = eventlog.Started
	Stopped = eventlog.Stopped
	Crashed = eventlog.Crashed
	Applied = eventlog.Applied
)

// Event is something QEMU reported about a running VM, or a lifecycle
// event of vmsup's. Its JSON is one line of `vmsup events --json` and of
// the remote API's GET /v1/events (one schema: cmd/vmsup
// TestCLIAndAPIShareSchema).
type Event struct {
	VM   string    `json:"name"`
	Time time.Time `json:"time"` // QEMU's timestamp
	// Source is "qemu", or "vmsup" for its lifecycle events (started,
	// stopped, crashed, applied).
	Source string `json:"source"`
	// Kind is QEMU's event name: SHUTDOWN, POWERDOWN, RESET, STOP, RESUME,
	// GUEST_PANICKED, DEVICE_DELETED, BLOCK_IO_ERROR, MIGRATION, ...
	Kind string `json:"event"`
	// Reason is the cause QEMU gives, where it gives one (SHUTDOWN,
	// RESET: "guest-shutdown", "host-qmp-quit", "guest-reset", ...).
	Reason string         `json:"reason"`
	Data   map[string]any `json:"data"` // the event's data, as QEMU sent it ({} when none)
}

// Host is what reading events needs of its environment (a *machine.Env).
type Host interface {
	// State is the state root: the VMs' records and histories.
	State() vmstore.Store
	// Absent is the error for a VM whose QEMU does not run: no such VM, or
	// not running.
	Absent(name string) error
}

// errEnded ends Stream's follower when the VM's QEMU ended.
var errEnded = errors.New("the VM's QEMU ended")

// poll is how often a follower looks for new events.
const poll = 200 * time.Millisecond

// Follow calls emit with the events of the VMs at or after since, in time
// order, then (follow) with each new one until ctx ends. It reads the VMs'
// histories and their running QEMUs' event logs: it takes nothing from
// QEMU, so any number can run.
func Follow(ctx context.Context, h Host, names []string, since time.Time, follow bool, emit func(Event) error) error {
	store := h.State()
	tails := make([]*eventlog.Tail, len(names))
	var first []eventlog.Record
	for i, name := range names {
		if err := spec.ValidName(name); err != nil {
			return vmerr.Wrap(name, err)
		}
		p := store.Paths(name)
		if _, err := os.Stat(p.Records); err != nil {
			return h.Absent(name)
		}
		tails[i] = eventlog.NewTail(name, p.EventHistory(), func() string { return currentLog(store, name) })
		recs, err := tails[i].Start(since)
		if err != nil {
			return vmerr.Wrap(name, err)
		}
		first = append(first, recs...)
	}
	if err := emitAll(first, emit); err != nil {
		return err
	}
	for follow {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
		var recs []eventlog.Record
		for _, t := range tails {
			recs = append(recs, t.Next()...)
		}
		if err := emitAll(recs, emit); err != nil {
			return err
		}
	}
	return nil
}

// emitAll emits recs in time order.
func emitAll(recs []eventlog.Record, emit func(Event) error) error {
	eventlog.Sort(recs)
	for _, r := range recs {
		if err := emit(fromRecord(r)); err != nil {
			return err
		}
	}
	return nil
}

// Stream sends the VM's events from since on until ctx ends or the VM's
// QEMU ends (then the channel closes): what happened before the call comes
// first, so a caller that starts the VM and then subscribes gets its
// "started" event. Only the end of the QEMU running now closes the
// channel, not that of an earlier run since then.
func Stream(ctx context.Context, h Host, name string, since time.Time) (<-chan Event, error) {
	if err := spec.ValidName(name); err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	store := h.State()
	if _, err := os.Stat(store.Paths(name).QMP); err != nil {
		return nil, h.Absent(name)
	}
	var started time.Time // this QEMU's start: ends before it are an earlier run's
	if app, err := store.ReadApplied(name); err == nil {
		started = app.StartedAt
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan Event, 64)
	go func() {
		defer close(out)
		defer cancel()
		_ = Follow(ctx, h, []string{name}, since, true, func(e Event) error {
			select {
			case out <- e:
			case <-ctx.Done():
				return ctx.Err()
			}
			if e.Source == eventlog.SourceVmsup && (e.Kind == Stopped || e.Kind == Crashed) && !e.Time.Before(started) {
				return errEnded
			}
			return nil
		})
	}()
	return out, nil
}

// fromRecord is a history record as an Event.
func fromRecord(r eventlog.Record) Event {
	e := Event{VM: r.VM, Time: r.Time, Kind: r.Event, Source: r.Source}
	if len(r.Data) > 0 {
		_ = json.Unmarshal(r.Data, &e.Data)
		if reason, ok := e.Data["reason"].(string); ok {
			e.Reason = reason
		}
	}
	return e
}

// currentLog is the running QEMU's event log (.out) of VM name, "" if
// none.
func currentLog(store vmstore.Store, name string) string {
	if app, err := store.ReadApplied(name); err == nil && app.EventLog != "" {
		return app.EventLog + ".out"
	}
	return ""
}
