package machine

import (
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// A VM's history: the lifecycle events vmsup writes, and the events of a
// QEMU that ended (internal/observe/events reads them).

// Lifecycle records a vmsup event of the VM; a failure to write it is
// logged, never the command's failure.
func (s *Env) Lifecycle(name, event string, data any) {
	r := eventlog.Record{Time: time.Now().UTC(), VM: name, Source: eventlog.SourceVmsup, Event: event}
	if data != nil {
		r.Data, _ = json.Marshal(data)
	}
	if err := eventlog.Append(s.Paths(name).EventHistory(), r); err != nil {
		s.opts.Logger.Warn("event history", "vm", name, "event", event, "err", err)
	}
}

// archiveEvents moves the events of an ended QEMU's log into the history
// (a fresh start keeps what a QEMU whose stop-post never ran left).
func (s *Env) archiveEvents(name, base string) error {
	recs, err := eventlog.QEMUEvents(base+".out", name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := eventlog.Append(s.Paths(name).EventHistory(), recs...); err != nil {
		return err
	}
	return os.Truncate(base+".out", 0)
}

// endedQEMU reads what the stop-post hook needs of the unit's QEMU that
// ended: its record and its event log's events (nothing when the unit is no
// longer the VM's, e.g. a local migration's old QEMU).
func (s *Env) endedQEMU(name, unit string) (*vmstore.Applied, []eventlog.Record) {
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
func (s *Env) recordEnd(name, unit string, app *vmstore.Applied, recs []eventlog.Record) string {
	if app == nil {
		return ""
	}
	if err := eventlog.Append(s.Paths(name).EventHistory(), recs...); err != nil {
		s.opts.Logger.Warn("event history", "vm", name, "err", err)
	} else if app.EventLog != "" {
		_ = os.Truncate(app.EventLog+".out", 0)
	}
	result := os.Getenv("SERVICE_RESULT")
	ev, reason := endKind(recs, result)
	// The mark is vmsup's SIGKILL only for an end by a signal: a mark left
	// by a kill that never happened must not relabel a clean stop.
	if os.Remove(s.Paths(name).KillMark()) == nil && result == "signal" {
		ev, reason = eventlog.Stopped, "killed by vmsup"
	}
	s.Lifecycle(name, ev, map[string]string{"reason": reason, "result": result, "exit_code": os.Getenv("EXIT_CODE"),
		"exit_status": os.Getenv("EXIT_STATUS"), "unit": unit})
	return ev
}
