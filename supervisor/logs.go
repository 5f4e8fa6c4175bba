package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/observe/logs"
)

// A VM's log (its units' journal and its console log, merged) is read in
// internal/observe/logs; here is the library's API.

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
	return logs.Read(ctx, s.env, name, o, fn)
}
