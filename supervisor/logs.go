package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/observe/logs"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/units"
)

// A VM's log (its units' journal and its console log, merged) is read in
// internal/observe/logs; here are its Host and the library's API.

// LogOptions select what Logs shows.
type LogOptions = logs.Options

// LogLine is one line of a VM's log: a message of its units' journal, or a
// line the guest wrote on its serial console.
type LogLine = logs.Line

// Logs gives the VM's journal (its units: QEMU's own messages and
// systemd's about it) and its console log, merged: console lines go right
// after the start of the QEMU that wrote them (the log holds the current
// run only), and the journal's later messages among them by time. With
// Follow, new lines of both follow in the order they appear.
func (s *Supervisor) Logs(ctx context.Context, name string, o LogOptions, fn func(LogLine)) error {
	return logs.Read(ctx, logsHost{s}, name, o, fn)
}

// logsHost is the log reader's Host.
type logsHost struct{ s *Supervisor }

var _ logs.Host = logsHost{}

func (h logsHost) State() vmstore.Store                        { return h.s.env.State() }
func (h logsHost) NotFound(name string) error                  { return h.s.env.NotFound(name) }
func (h logsHost) ConsoleConfig(name string) consolelog.Config { return h.s.env.ConsoleConfig(name) }
func (h logsHost) Journal(ctx context.Context, o units.JournalOptions, fn func(units.Entry)) error {
	o.Dir = h.s.env.Opts().JournalDir
	return units.Journal(ctx, o, fn)
}
