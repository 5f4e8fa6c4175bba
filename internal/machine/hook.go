package machine

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
)

// Hook commands: what a VM's units run as Options.Self (ExecStop=,
// ExecStopPost=, the guardian unit), as "SELF HOOK --root ROOT [--unit U]
// [--systemd-bus B] NAME".
const (
	HookStop   = "stop-hook"
	HookPost   = "stop-post"
	HookSettle = "settle"
)

// HookConsoleLog is the console logger's command, which the logger's unit
// runs: "SELF console-log --fifo F --max BYTES --keep N LOG".
const HookConsoleLog = companion.HookConsoleLog

// RunConsoleLog is the console logger's work (HookConsoleLog's arguments
// after the command): copy the FIFO into the log until its QEMU closes it.
func RunConsoleLog(ctx context.Context, args []string) error {
	return companion.RunConsoleLog(ctx, args)
}

// ErrNoSelf is returned by a start when Options.Self is unset and no vmsup
// binary was found: a unit must have something to call for its graceful stop.
var ErrNoSelf = errors.New("no stop hook: Options.Self is unset and no vmsup binary is installed (set Self to a vmsup binary, or to your program if its main calls supervisor.HandleHook first)")

// defaultSelf is the binary the units call back into when Options.Self is
// unset: the running program if it is vmsup itself, else an installed vmsup.
// Never another embedding program: systemd would run it as root with hook
// arguments it does not know.
func defaultSelf() string {
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "vmsup" {
		return exe
	}
	for _, p := range []string{"/usr/local/bin/vmsup", "/usr/bin/vmsup"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// StopPostHook is the unit's ExecStopPost= work: the network and secret
// copies go (StopPost); then, if the guest rebooted into a QEMU told to
// exit on reboot, its guardian starts it again.
func (s *Env) StopPostHook(ctx context.Context, name, unit string) (string, error) {
	if err := s.StopPost(ctx, name, unit); err != nil {
		return "", err
	}
	note := "network removed, secret copies removed"
	app, recs := s.endedQEMU(name, unit) // read once: the reboot check and the history use them
	again, err := s.afterGuestReboot(ctx, name, eventlog.LastOf(recs, "SHUTDOWN"))
	if again || err != nil {
		note += "; the guest rebooted: " + rebootUnit(name) + " starts it again"
	}
	ev := s.recordEnd(name, unit, app, recs)
	if !again && err == nil {
		var why string
		why, err = s.restartAfter(ctx, name, app, ev)
		note = joinNote(note, why)
	}
	return note, err
}
