package eventlog

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestTail: a tail gives what the history and the running QEMU's log hold
// at or after since, then only what is added; a QEMU event moved from the
// log into the history is not given twice; a new log (a new QEMU) is read
// from its start.
func TestTail(t *testing.T) {
	dir := t.TempDir()
	hist, log1, log2 := filepath.Join(dir, "events.log"), filepath.Join(dir, "q1.out"), filepath.Join(dir, "q2.out")
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	if err := Append(hist, Record{Time: t0, VM: "web", Source: SourceVmsup, Event: "started"}); err != nil {
		t.Fatal(err)
	}
	qemu := func(path string, sec int, event string) {
		f, _ := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		defer f.Close()
		ts := t0.Add(time.Duration(sec) * time.Second)
		f.WriteString(`{"timestamp":{"seconds":` + strconv.FormatInt(ts.Unix(), 10) + `,"microseconds":0},"event":"` + event + `"}` + "\n")
	}
	qemu(log1, 1, "RESUME")
	current := log1
	tl := NewTail("web", hist, func() string { return current })
	recs, err := tl.Start(t0)
	if err != nil || len(recs) != 2 || recs[0].Event != "started" || recs[1].Event != "RESUME" {
		t.Fatalf("start: %+v %v", recs, err)
	}
	qemu(log1, 2, "STOP")
	if r := tl.Next(); len(r) != 1 || r[0].Event != "STOP" {
		t.Fatalf("next: %+v", r)
	}
	// The stop-post hook moves the log's events into the history: not again.
	live, _ := QEMUEvents(log1, "web")
	if err := Append(hist, append(live, Record{Time: t0.Add(3 * time.Second), VM: "web", Source: SourceVmsup, Event: "stopped"})...); err != nil {
		t.Fatal(err)
	}
	if r := tl.Next(); len(r) != 1 || r[0].Event != "stopped" {
		t.Fatalf("after the archive: %+v", r)
	}
	current = log2 // a new QEMU
	qemu(log2, 4, "RESUME")
	if r := tl.Next(); len(r) != 1 || r[0].Event != "RESUME" {
		t.Fatalf("a new QEMU's log: %+v", r)
	}
}
