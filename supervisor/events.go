package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/observe/events"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// A VM's events are read in internal/observe/events (QEMU's event log and the
// VM's history, no resident process); here the supervisor writes the
// history: its lifecycle events, and a QEMU's events when it ends.

// Lifecycle events vmsup writes.
const (
	EventStarted = events.Started
	EventStopped = events.Stopped
	EventCrashed = events.Crashed
	EventApplied = events.Applied
)

// lifecycle records a vmsup event of the VM; a failure to write it is
// logged, never the command's failure.
func (s *Supervisor) lifecycle(name, event string, data any) {
	r := eventlog.Record{Time: time.Now().UTC(), VM: name, Source: eventlog.SourceVmsup, Event: event}
	if data != nil {
		r.Data, _ = json.Marshal(data)
	}
	if err := eventlog.Append(s.paths(name).EventHistory(), r); err != nil {
		s.opts.Logger.Warn("event history", "vm", name, "event", event, "err", err)
	}
}

// archiveEvents moves the events of an ended QEMU's log into the history
// (a fresh start keeps what a QEMU whose stop-post never ran left).
func (s *Supervisor) archiveEvents(name, base string) error {
	recs, err := eventlog.QEMUEvents(base+".out", name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := eventlog.Append(s.paths(name).EventHistory(), recs...); err != nil {
		return err
	}
	return os.Truncate(base+".out", 0)
}

// FollowEvents calls emit with the events of the VMs at or after since, in
// time order, then (follow) with each new one until ctx ends. It reads the
// VMs' histories and their running QEMUs' event logs: it takes nothing
// from QEMU, so any number can run.
func (s *Supervisor) FollowEvents(ctx context.Context, names []string, since time.Time, follow bool, emit func(Event) error) error {
	return events.Follow(ctx, eventsHost{s}, names, since, follow, emit)
}

// eventsHost is the event readers' Host.
type eventsHost struct{ s *Supervisor }

var _ events.Host = eventsHost{}

func (h eventsHost) State() vmstore.Store     { return h.s.state }
func (h eventsHost) Absent(name string) error { return h.s.absent(name) }

// endedQEMU reads what the stop-post hook needs of the unit's QEMU that
// ended: its record and its event log's events (nothing when the unit is no
// longer the VM's, e.g. a local migration's old QEMU).
func (s *Supervisor) endedQEMU(name, unit string) (*vmstore.Applied, []eventlog.Record) {
	if !s.isCurrentUnit(name, unit) {
		return nil, nil
	}
	app, err := s.state.ReadApplied(name)
	if err != nil || app.EventLog == "" {
		return app, nil
	}
	recs, _ := eventlog.QEMUEvents(app.EventLog+".out", name)
	return app, recs
}

// recordEnd is the stop-post hook's record of a QEMU that ended: its events
// (recs) go into the history and its log is emptied, then "stopped" (with
// QEMU's shutdown reason), "panicked" or "crashed" (killed by a signal, or
// a failed exit) from what systemd tells the hook (SERVICE_RESULT,
// EXIT_CODE, EXIT_STATUS). It returns that event.
func (s *Supervisor) recordEnd(name, unit string, app *vmstore.Applied, recs []eventlog.Record) string {
	if app == nil {
		return ""
	}
	if err := eventlog.Append(s.paths(name).EventHistory(), recs...); err != nil {
		s.opts.Logger.Warn("event history", "vm", name, "err", err)
	} else if app.EventLog != "" {
		_ = os.Truncate(app.EventLog+".out", 0)
	}
	result := os.Getenv("SERVICE_RESULT")
	ev, reason := endKind(recs, result)
	// The mark is vmsup's SIGKILL only for an end by a signal: a mark left
	// by a kill that never happened must not relabel a clean stop.
	if os.Remove(s.paths(name).KillMark()) == nil && result == "signal" {
		ev, reason = EventStopped, "killed by vmsup"
	}
	s.lifecycle(name, ev, map[string]string{"reason": reason, "result": result, "exit_code": os.Getenv("EXIT_CODE"),
		"exit_status": os.Getenv("EXIT_STATUS"), "unit": unit})
	return ev
}
