// Package eventlog reads a QEMU event log (the file a second QMP monitor
// writes every event to while no client is connected, see
// qemuargs.Options.EventLog) and keeps a VM's event history. QEMU writes the
// log; vmsup only reads it, bounded.
package eventlog

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"time"
)

// Event is one QMP event as QEMU writes it.
type Event struct {
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data,omitempty"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// Time is when QEMU emitted the event.
func (e Event) Time() time.Time {
	return time.Unix(e.Timestamp.Seconds, e.Timestamp.Microseconds*1000)
}

// MaxLog bounds how much of a QEMU's event log is read: its last MaxLog
// bytes (the events that end a QEMU are its last lines).
const MaxLog = 4 << 20

// QEMUEvents reads the QMP events of a QEMU's event log (Options.EventLog's
// .out file) as records of vm: the log's last MaxLog bytes. A line cut off
// by a kill, or by the bound, is skipped.
func QEMUEvents(path, vm string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > MaxLog {
		if _, err := f.Seek(fi.Size()-MaxLog, io.SeekStart); err != nil {
			return nil, err
		}
	}
	var out []Record
	sc := bufio.NewScanner(io.LimitReader(f, MaxLog))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		if r, ok := ParseQEMU(sc.Bytes(), vm); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// LastOf returns the last record of event in recs, or nil.
func LastOf(recs []Record, event string) *Record {
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Event == event {
			return &recs[i]
		}
	}
	return nil
}

// Reason is the "reason" of the record's data (SHUTDOWN, RESET, and
// vmsup's stopped), if any.
func (r Record) Reason() string {
	var d struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(r.Data, &d)
	return d.Reason
}
