package eventlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"syscall"
	"time"
)

// The VM's event history: JSON lines, one Record each, appended by vmsup
// (its lifecycle events, and QEMU's events when that QEMU ends) under an
// flock, rotated at MaxHistory into HISTORY.1, so that it never grows past
// twice that. Readers need no lock: a line is written whole by one write.

// MaxHistory is the size at which the history is rotated.
const MaxHistory = 1 << 20

// Record is one event of a VM's history.
type Record struct {
	Time   time.Time       `json:"time"`
	VM     string          `json:"vm"`
	Source string          `json:"source"` // "qemu" or "vmsup"
	Event  string          `json:"event"`  // QEMU's name (RESET, STOP, ...) or vmsup's (started, stopped, crashed, ...)
	Data   json.RawMessage `json:"data,omitempty"`
}

// Lifecycle events vmsup writes (Source vmsup).
const (
	Started = "started"
	Stopped = "stopped"
	Crashed = "crashed"
	Applied = "applied"
)

// Sources of events.
const (
	SourceQEMU  = "qemu"
	SourceVmsup = "vmsup"
)

// ParseQEMU reads one line of a QEMU event log as a record of vm; ok is
// false for the lines that are not events.
func ParseQEMU(line []byte, vm string) (Record, bool) {
	if !bytes.Contains(line, []byte(`"event"`)) {
		return Record{}, false // the greeting, the reply to qmp_capabilities
	}
	var e Event
	if json.Unmarshal(line, &e) != nil || e.Event == "" {
		return Record{}, false
	}
	return Record{Time: e.Time().UTC(), VM: vm, Source: SourceQEMU, Event: e.Event, Data: e.Data}, true
}

// Append adds records to the history at path, rotating it first when it
// has grown past MaxHistory.
func Append(path string, recs ...Record) error {
	if len(recs) == 0 {
		return nil
	}
	var buf bytes.Buffer
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	if fi, err := f.Stat(); err == nil && fi.Size()+int64(buf.Len()) > MaxHistory {
		// Rotate under the lock: the next writer opens the new file.
		if err := os.Rename(path, path+".1"); err != nil {
			return fmt.Errorf("rotate %s: %w", path, err)
		}
		nf, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer nf.Close()
		f = nf
	}
	_, err = f.Write(buf.Bytes())
	return err
}

// History reads the history at path (its rotated part first), records at
// or after since, in time order.
func History(path string, since time.Time) ([]Record, error) {
	var out []Record
	for _, p := range []string{path + ".1", path} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			var r Record
			if json.Unmarshal(sc.Bytes(), &r) == nil && !r.Time.Before(since) {
				out = append(out, r)
			}
		}
		f.Close()
	}
	Sort(out)
	return out, nil
}

// Sort orders records by time (stable: same-time records keep their order).
func Sort(rs []Record) {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Time.Before(rs[j].Time) })
}

// tailRead bounds how much of the history's end LastVmsup reads: status
// calls it for every stopped VM, so it must not read the whole file.
const tailRead = 64 << 10

// LastVmsup returns the last record vmsup wrote in the history at path (a
// lifecycle event: why the VM is where it is), or nil.
func LastVmsup(path string) *Record {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	start := max(0, fi.Size()-tailRead)
	b := make([]byte, fi.Size()-start)
	if _, err := f.ReadAt(b, start); err != nil && !errors.Is(err, io.EOF) {
		return nil
	}
	lines := bytes.Split(b, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var r Record
		if json.Unmarshal(lines[i], &r) == nil && r.Source == SourceVmsup {
			return &r
		}
	}
	return nil
}
