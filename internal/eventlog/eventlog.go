// Package eventlog reads a QEMU event log: the file a second QMP monitor
// writes every event to while no client is connected
// (qemuargs.Options.EventLog). QEMU writes it; vmsup only reads it, bounded.
package eventlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"time"
)

// Event is one QMP event of the log.
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

// Reason is the "reason" of the event's data (SHUTDOWN, RESET), if any.
func (e Event) Reason() string {
	var d struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(e.Data, &d)
	return d.Reason
}

// maxTail is how much of the log's end Last reads: the events that end a
// QEMU are its last lines.
const maxTail = 256 << 10

// Last returns the last event called name in the log's last 256 KiB, or nil.
func Last(path, name string) (*Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > maxTail {
		if _, err := f.Seek(fi.Size()-maxTail, io.SeekStart); err != nil {
			return nil, err
		}
	}
	var last *Event
	sc := bufio.NewScanner(io.LimitReader(f, maxTail))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	want := []byte(`"` + name + `"`)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, want) {
			continue
		}
		var e Event
		if json.Unmarshal(line, &e) == nil && e.Event == name {
			last = &e
		}
	}
	return last, nil
}
