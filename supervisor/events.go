package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"

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
	EventApplied = "applied"
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
	tails := make([]*eventTail, len(names))
	var first []eventlog.Record
	for i, name := range names {
		if err := spec.ValidName(name); err != nil {
			return vmErr(name, err)
		}
		if _, err := os.Stat(s.paths(name).Records); err != nil {
			return s.absent(name)
		}
		tails[i] = &eventTail{s: s, name: name}
		recs, err := tails[i].start(since)
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
			recs = append(recs, t.next()...)
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

// eventTail follows one VM's history and its running QEMU's event log.
type eventTail struct {
	s        *Supervisor
	name     string
	histOff  int64
	log      string // the running QEMU's event log (.out), "" if none
	logOff   int64
	lastQEMU time.Time // QEMU events up to here were emitted from the log
}

// start reads what there is at or after since and remembers where it ended.
func (t *eventTail) start(since time.Time) ([]eventlog.Record, error) {
	p := t.s.paths(t.name)
	recs, err := eventlog.History(p.EventHistory(), since)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(p.EventHistory()); err == nil {
		t.histOff = fi.Size()
	}
	t.log = t.currentLog()
	if t.log != "" {
		live, _ := eventlog.QEMUEvents(t.log, t.name)
		for _, r := range live {
			if !r.Time.Before(since) {
				recs = append(recs, r)
			}
			t.lastQEMU = r.Time
		}
		if fi, err := os.Stat(t.log); err == nil {
			t.logOff = fi.Size()
		}
	}
	return recs, nil
}

func (t *eventTail) currentLog() string {
	if app, err := t.s.state.ReadApplied(t.name); err == nil && app.EventLog != "" {
		return app.EventLog + ".out"
	}
	return ""
}

// next returns what was added since the last look. QEMU events that were
// read from the log and then moved into the history are not repeated.
func (t *eventTail) next() []eventlog.Record {
	var out []eventlog.Record
	hist := t.s.paths(t.name).EventHistory()
	lines, off := readFrom(hist, t.histOff)
	t.histOff = off
	for _, l := range lines {
		var r eventlog.Record
		if json.Unmarshal(l, &r) != nil {
			continue
		}
		if r.Source == eventlog.SourceQEMU && !r.Time.After(t.lastQEMU) {
			continue
		}
		out = append(out, r)
	}
	if log := t.currentLog(); log != t.log {
		t.log, t.logOff = log, 0 // a new QEMU (a migration's)
	}
	if t.log != "" {
		lines, off := readFrom(t.log, t.logOff)
		t.logOff = off
		for _, l := range lines {
			if r, ok := eventlog.ParseQEMU(l, t.name); ok && r.Time.After(t.lastQEMU) {
				out = append(out, r)
				t.lastQEMU = r.Time
			}
		}
	}
	return out
}

// readFrom returns the whole lines of path after off and the offset after
// them; a file shorter than off was replaced or truncated: read it anew.
func readFrom(path string, off int64) ([][]byte, int64) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() < off {
		off = 0
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, off
	}
	var lines [][]byte
	r := bufio.NewReader(io.LimitReader(f, eventlog.MaxHistory))
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return lines, off // a partial line waits for its end
		}
		off += int64(len(line))
		lines = append(lines, line[:len(line)-1])
	}
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
