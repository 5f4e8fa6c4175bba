package eventlog

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"time"
)

// Tail follows one VM's history and its running QEMU's event log, for a
// reader that wants what there is and then what comes (vmsup events -f):
// it takes nothing from QEMU, so any number can run.
type Tail struct {
	vm       string
	hist     string        // the history file
	current  func() string // the running QEMU's event log (.out), "" if none
	histOff  int64
	log      string
	logOff   int64
	lastQEMU time.Time // QEMU events up to here were emitted from the log
}

// NewTail is a tail of VM vm's history at hist and of the event log
// current names (asked at each look: a migration starts a new QEMU).
func NewTail(vm, hist string, current func() string) *Tail {
	return &Tail{vm: vm, hist: hist, current: current}
}

// Start reads what there is at or after since and remembers where it ended.
func (t *Tail) Start(since time.Time) ([]Record, error) {
	recs, err := History(t.hist, since)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(t.hist); err == nil {
		t.histOff = fi.Size()
	}
	t.log = t.current()
	if t.log != "" {
		live, _ := QEMUEvents(t.log, t.vm)
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

// Next returns what was added since the last look. QEMU events that were
// read from the log and then moved into the history are not repeated.
func (t *Tail) Next() []Record {
	var out []Record
	lines, off := readFrom(t.hist, t.histOff)
	t.histOff = off
	for _, l := range lines {
		var r Record
		if json.Unmarshal(l, &r) != nil {
			continue
		}
		if r.Source == SourceQEMU && !r.Time.After(t.lastQEMU) {
			continue
		}
		out = append(out, r)
	}
	if log := t.current(); log != t.log {
		t.log, t.logOff = log, 0 // a new QEMU (a migration's)
	}
	if t.log != "" {
		lines, off := readFrom(t.log, t.logOff)
		t.logOff = off
		for _, l := range lines {
			if r, ok := ParseQEMU(l, t.vm); ok && r.Time.After(t.lastQEMU) {
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
	r := bufio.NewReader(io.LimitReader(f, MaxHistory))
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return lines, off // a partial line waits for its end
		}
		off += int64(len(line))
		lines = append(lines, line[:len(line)-1])
	}
}
