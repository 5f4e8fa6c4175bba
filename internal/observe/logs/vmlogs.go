// Package vmlogs gives a VM's log (vmsup logs): its units' journal
// (QEMU's own messages and systemd's about it) and its console log (what
// the guest wrote on its serial console), merged in one stream, read back
// and followed, console lines without the guest's terminal control
// sequences (Plain). It only reads: the console log is written by the VM's
// console logger (internal/console/consolelog), the journal by systemd.
package logs

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Host is what reading a VM's log needs of its environment: a
// *machine.Env; the tests fake its journal.
type Host interface {
	// State is the state root: the VMs' directories.
	State() vmstore.Store
	// NotFound is the error for a VM name vmsup does not know.
	NotFound(name string) error
	// ConsoleConfig is the VM's console log as it was last started.
	ConsoleConfig(name string) consolelog.Config
	// UnitJournal reads the units' messages (units.Journal, from the
	// journal the VMs' systemd writes).
	UnitJournal(ctx context.Context, o units.JournalOptions, fn func(units.Entry)) error
}

// Options select what Read shows.
type Options struct {
	Since  time.Time // zero: everything kept
	Follow bool      // then keep showing new lines until ctx ends
}

// Line is one line of a VM's log: a message of its units' journal, or a
// line the guest wrote on its serial console.
type Line struct {
	// Time of a journal message, or when a console line was written (read
	// back: from the log's time index, to within 0.1 s; followed: when it
	// was seen). Zero for a console line whose time is not known (a log
	// written before the index, or by a guest that writes a byte at a time
	// for long).
	Time   time.Time `json:"time"`
	Source string    `json:"source"` // "console", or the unit that logged it
	Text   string    `json:"text"`
}

// maxConsoleBack is how much of the console log Read reads back (its end).
const maxConsoleBack = 4 << 20

// Read gives the VM's journal and its console log, merged: console lines
// go right after the start of the QEMU that wrote them (the log holds the
// current run only), and the journal's later messages among them by time.
// With Follow, new lines of both follow in the order they appear.
func Read(ctx context.Context, h Host, name string, o Options, fn func(Line)) error {
	if err := spec.ValidName(name); err != nil {
		return vmerr.Wrap(name, err)
	}
	if _, err := os.Stat(h.State().Paths(name).Dir); errors.Is(err, os.ErrNotExist) {
		return h.NotFound(name)
	}
	unitNames := []string{vmstore.UnitName(name), vmstore.AltUnit(name, vmstore.UnitName(name)), vmstore.SettleUnit(name)}
	var entries []units.Entry
	err := h.UnitJournal(ctx, units.JournalOptions{Units: unitNames, Since: o.Since},
		func(e units.Entry) { entries = append(entries, e) })
	if err != nil {
		return vmerr.Wrap(name, err)
	}
	cc := h.ConsoleConfig(name)
	console, end := readConsoleBack(cc, o.Since)
	merge(entries, console, o.Since, fn)
	if !o.Follow {
		return nil
	}
	cursor := ""
	if len(entries) > 0 {
		cursor = entries[len(entries)-1].Cursor
	}
	var mu sync.Mutex
	emit := func(l Line) { mu.Lock(); fn(l); mu.Unlock() }
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tailConsole(fctx, cc, end, emit)
	}()
	err = h.UnitJournal(fctx, units.JournalOptions{Units: unitNames, Follow: true, AfterCursor: cursor},
		func(e units.Entry) { emit(journalLine(e)) })
	cancel()
	<-done
	return vmerr.Wrap(name, err)
}

func journalLine(e units.Entry) Line { return Line{Time: e.Time, Source: e.Unit, Text: e.Message} }

// merge gives the journal's entries up to the last "Started" message (the
// start of the run the console log is of), then the console's lines (none
// written before since) with the later entries among them by time.
func merge(entries []units.Entry, console []Line, since time.Time, fn func(Line)) {
	at := len(entries)
	for i := len(entries) - 1; i >= 0; i-- {
		if strings.HasPrefix(entries[i].Message, "Started ") {
			at = i + 1
			break
		}
	}
	for _, e := range entries[:at] {
		fn(journalLine(e))
	}
	rest := entries[at:]
	for _, l := range console {
		if !l.Time.IsZero() && l.Time.Before(since) {
			continue
		}
		for len(rest) > 0 && !l.Time.IsZero() && rest[0].Time.Before(l.Time) {
			fn(journalLine(rest[0]))
			rest = rest[1:]
		}
		fn(l)
	}
	for _, e := range rest {
		fn(journalLine(e))
	}
}

// readConsoleBack returns the console log's lines (its last maxConsoleBack
// bytes, across its rotated files; none if it was last written before
// since), each with the time its end was written, and where they end, to
// follow it from.
func readConsoleBack(c consolelog.Config, since time.Time) ([]Line, consolelog.Position) {
	limit := int64(maxConsoleBack)
	if !since.IsZero() {
		// The newest file's time is the log's last write.
		if files := consolelog.Files(c); len(files) > 0 {
			if fi, err := os.Stat(files[len(files)-1]); err == nil && fi.ModTime().Before(since) {
				limit = 0 // its end only
			}
		}
	}
	t, err := consolelog.ReadBack(c, limit)
	if err != nil {
		return nil, consolelog.Position{}
	}
	var lines []Line
	data, off := string(t.Data), 0
	if t.Cut {
		off = strings.IndexByte(data, '\n') + 1 // a cut first line (none: all of it)
		if off == 0 {
			off = len(data)
		}
	}
	for off < len(data) {
		end := strings.IndexByte(data[off:], '\n')
		if end < 0 {
			end = len(data) - off // a line the guest has not ended yet
		}
		line := Line{Time: consolelog.TimeAt(t.Times, int64(off+end)), Source: "console",
			Text: Plain(data[off : off+end])}
		lines = append(lines, line)
		off += end + 1
	}
	return lines, t.End
}

// tailConsole shows what the guest writes to its console from `from` on,
// each complete line when it is seen, across the log's rotations; a log
// that shrinks (started anew) is read from its start.
func tailConsole(ctx context.Context, c consolelog.Config, from consolelog.Position, emit func(Line)) {
	var partial string
	_ = consolelog.Follow(ctx, c, from, func(b []byte) {
		lines := strings.Split(partial+string(b), "\n")
		partial = lines[len(lines)-1]
		now := time.Now()
		for _, l := range lines[:len(lines)-1] {
			emit(Line{Time: now, Source: "console", Text: Plain(l)})
		}
	})
}
