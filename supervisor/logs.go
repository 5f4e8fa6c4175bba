package supervisor

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// LogOptions select what Logs shows.
type LogOptions struct {
	Since  time.Time // zero: everything kept
	Follow bool      // then keep showing new lines until ctx ends
}

// LogLine is one line of a VM's log: a message of its units' journal, or a
// line the guest wrote on its serial console.
type LogLine struct {
	// Time of a journal message, or when Follow saw a console line. The
	// console log itself has no times: a line read back has none (zero).
	Time   time.Time `json:"time"`
	Source string    `json:"source"` // "console", or the unit that logged it
	Text   string    `json:"text"`
}

// maxConsoleBack is how much of the console log Logs reads back (its end).
const maxConsoleBack = 4 << 20

// Logs gives the VM's journal (its units: QEMU's own messages and
// systemd's about it) and its console log, merged: console lines have no
// time, so they go right after the start of the QEMU that wrote them (the
// log holds the current run only). With Follow, new lines of both follow
// in the order they appear.
func (s *Supervisor) Logs(ctx context.Context, name string, o LogOptions, fn func(LogLine)) error {
	if err := spec.ValidName(name); err != nil {
		return vmErr(name, err)
	}
	p := s.paths(name)
	if _, err := os.Stat(p.Dir); errors.Is(err, os.ErrNotExist) {
		return vmErr(name, ErrNotFound)
	}
	unitNames := []string{vmstate.UnitName(name), vmstate.AltUnit(name, vmstate.UnitName(name)), vmstate.SettleUnit(name)}
	var entries []units.Entry
	err := units.Journal(ctx, units.JournalOptions{Dir: s.opts.JournalDir, Units: unitNames, Since: o.Since},
		func(e units.Entry) { entries = append(entries, e) })
	if err != nil {
		return vmErr(name, err)
	}
	console, offset := readConsoleBack(p.ConsoleLog, o.Since)
	// After the last "Started" message: the run the console log is of.
	at := len(entries)
	for i := len(entries) - 1; i >= 0; i-- {
		if strings.HasPrefix(entries[i].Message, "Started ") {
			at = i + 1
			break
		}
	}
	for _, e := range entries[:at] {
		fn(LogLine{Time: e.Time, Source: e.Unit, Text: e.Message})
	}
	for _, l := range console {
		fn(LogLine{Source: "console", Text: l})
	}
	for _, e := range entries[at:] {
		fn(LogLine{Time: e.Time, Source: e.Unit, Text: e.Message})
	}
	if !o.Follow {
		return nil
	}
	cursor := ""
	if len(entries) > 0 {
		cursor = entries[len(entries)-1].Cursor
	}
	var mu sync.Mutex
	emit := func(l LogLine) { mu.Lock(); fn(l); mu.Unlock() }
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tailConsole(fctx, p.ConsoleLog, offset, emit)
	}()
	err = units.Journal(fctx, units.JournalOptions{Dir: s.opts.JournalDir, Units: unitNames, Follow: true, AfterCursor: cursor},
		func(e units.Entry) { emit(LogLine{Time: e.Time, Source: e.Unit, Text: e.Message}) })
	cancel()
	<-done
	return vmErr(name, err)
}

// readConsoleBack returns the console log's lines (its last maxConsoleBack
// bytes; none if it was last written before since) and its size.
func readConsoleBack(path string, since time.Time) ([]string, int64) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, 0
	}
	if !since.IsZero() && fi.ModTime().Before(since) {
		return nil, fi.Size()
	}
	start := max(0, fi.Size()-maxConsoleBack)
	b, _ := io.ReadAll(io.NewSectionReader(f, start, fi.Size()-start))
	text := strings.ReplaceAll(string(b), "\r", "")
	if start > 0 {
		_, text, _ = strings.Cut(text, "\n") // a cut first line
	}
	text = strings.TrimSuffix(text, "\n")
	if text == "" {
		return nil, fi.Size()
	}
	return strings.Split(text, "\n"), fi.Size()
}

// tailConsole shows what the guest writes to its console from offset on,
// each complete line when it is seen; a log that shrinks (a new QEMU) is
// read from its start.
func tailConsole(ctx context.Context, path string, offset int64, emit func(LogLine)) {
	var partial string
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if fi, err := os.Stat(path); err == nil {
			if fi.Size() < offset {
				offset, partial = 0, ""
			}
			if fi.Size() > offset {
				if f, err := os.Open(path); err == nil {
					b, _ := io.ReadAll(io.NewSectionReader(f, offset, min(fi.Size()-offset, maxConsoleBack)))
					f.Close()
					offset += int64(len(b))
					lines := strings.Split(partial+strings.ReplaceAll(string(b), "\r", ""), "\n")
					partial = lines[len(lines)-1]
					now := time.Now()
					for _, l := range lines[:len(lines)-1] {
						emit(LogLine{Time: now, Source: "console", Text: l})
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
