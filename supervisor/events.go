package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/apply"
	"github.com/vmsup/vmsup/internal/eventlog"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
)

// Events without a resident process: QEMU writes its events to its event
// log with no client (qemuargs.Options.EventLog); when a QEMU ends, its
// stop-post hook moves them into the VM's history (internal/eventlog), where
// vmsup also writes its lifecycle events (started, stopped, crashed,
// applied). Readers read files: any number at once, beside vmsup's own
// commands (which keep the event socket), and nothing is lost while none
// runs.

// Lifecycle events vmsup writes.
const (
	EventStarted = "started"
	EventStopped = "stopped"
	EventCrashed = "crashed"
	EventApplied = apply.EventApplied
)

// errEventsEnded ends Events' follower when the VM's QEMU ended.
var errEventsEnded = errors.New("the VM's QEMU ended")

// eventPoll is how often a follower looks for new events.
const eventPoll = 200 * time.Millisecond

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

// toEvent is a history record as the library's Event.
func toEvent(r eventlog.Record) Event {
	e := Event{VM: r.VM, Time: r.Time, Kind: r.Event, Source: r.Source}
	if len(r.Data) > 0 {
		_ = json.Unmarshal(r.Data, &e.Data)
		if reason, ok := e.Data["reason"].(string); ok {
			e.Reason = reason
		}
	}
	return e
}

// FollowEvents calls emit with the events of the VMs at or after since, in
// time order, then (follow) with each new one until ctx ends. It reads the
// VMs' histories and their running QEMUs' event logs: it takes nothing
// from QEMU, so any number can run.
func (s *Supervisor) FollowEvents(ctx context.Context, names []string, since time.Time, follow bool, emit func(Event) error) error {
	tails := make([]*eventlog.Tail, len(names))
	var first []eventlog.Record
	for i, name := range names {
		if err := spec.ValidName(name); err != nil {
			return vmErr(name, err)
		}
		if _, err := os.Stat(s.paths(name).Records); err != nil {
			return s.absent(name)
		}
		p := s.paths(name)
		tails[i] = eventlog.NewTail(name, p.EventHistory(), func() string { return s.currentEventLog(name) })
		recs, err := tails[i].Start(since)
		if err != nil {
			return vmErr(name, err)
		}
		first = append(first, recs...)
	}
	eventlog.Sort(first)
	for _, r := range first {
		if err := emit(toEvent(r)); err != nil {
			return err
		}
	}
	for follow {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(eventPoll):
		}
		var recs []eventlog.Record
		for _, t := range tails {
			recs = append(recs, t.Next()...)
		}
		eventlog.Sort(recs)
		for _, r := range recs {
			if err := emit(toEvent(r)); err != nil {
				return err
			}
		}
	}
	return nil
}

// currentEventLog is the running QEMU's event log (.out) of VM name, ""
// if none.
func (s *Supervisor) currentEventLog(name string) string {
	if app, err := s.state.ReadApplied(name); err == nil && app.EventLog != "" {
		return app.EventLog + ".out"
	}
	return ""
}

// endedQEMU reads what the stop-post hook needs of the unit's QEMU that
// ended: its record and its event log's events (nothing when the unit is no
// longer the VM's, e.g. a local migration's old QEMU).
func (s *Supervisor) endedQEMU(name, unit string) (*vmstate.Applied, []eventlog.Record) {
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
func (s *Supervisor) recordEnd(name, unit string, app *vmstate.Applied, recs []eventlog.Record) string {
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
