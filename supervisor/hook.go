package supervisor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

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

// HandleHook runs a hook command when args (os.Args[1:]) are one, and
// reports whether they were. A program that embeds the supervisor and sets
// Options.Self to itself calls it first thing in main:
//
//	func main() {
//		if code, ok := supervisor.HandleHook(os.Args[1:]); ok {
//			os.Exit(code)
//		}
//		...
//	}
func HandleHook(args []string) (code int, handled bool) {
	if len(args) == 0 || (args[0] != HookStop && args[0] != HookPost && args[0] != HookSettle && args[0] != HookRebootApply && args[0] != HookConsoleLog) {
		return 0, false
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	if args[0] == HookConsoleLog {
		if err := RunConsoleLog(ctx, args[1:]); err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", args[0], err)
			return 1, true
		}
		return 0, true
	}
	if err := RunHook(ctx, args, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", args[0], err)
		return 1, true
	}
	return 0, true
}

// RunHook is HandleHook's work, with a context and where to write its note.
func RunHook(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	root := fs.String("root", "/var/lib/vmsup", "")
	unit := fs.String("unit", "", "")
	bus := fs.String("systemd-bus", "", "")
	wait := fs.Bool("wait", false, "")
	var o Options // what startFlags passes on
	fs.StringVar(&o.QEMU, "qemu", "", "")
	fs.StringVar(&o.QEMUUser, "qemu-user", "", "")
	fs.StringVar(&o.Network.OVSDB, "ovsdb", "", "")
	for flag, dirs := range map[string]*[]string{"image-dir": &o.ImageDirs, "block-dir": &o.BlockDirs,
		"config-dir": &o.ConfigDirs, "allow-path": &o.AllowPaths} {
		fs.Func(flag, "", func(v string) error { *dirs = append(*dirs, v); return nil })
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want one VM name, got %q", fs.Args())
	}
	name := fs.Arg(0)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Root, o.SystemdBus, o.Self, o.WaitForLock = *root, *bus, self, *wait
	if args[0] == HookSettle {
		// Into the guardian unit's journal: each recovery that failed and
		// is tried again.
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s, err := New(o)
	if err != nil {
		return err
	}
	defer s.Close()
	switch args[0] {
	case HookStop:
		step, err := s.StopHook(ctx, name, *unit)
		fmt.Fprintf(stdout, "%s %s: %s\n", HookStop, name, step)
		return err
	case HookPost:
		note, err := s.StopPostHook(ctx, name, *unit)
		fmt.Fprintf(stdout, "%s %s: %s\n", HookPost, name, note)
		return err
	case HookRebootApply:
		note, err := s.RebootApply(ctx, name)
		fmt.Fprintf(stdout, "%s %s: %s\n", HookRebootApply, name, note)
		return err
	default:
		note, err := s.Settle(ctx, name)
		if note != "" {
			fmt.Fprintf(stdout, "%s: %s\n", name, note)
		}
		return err
	}
}

// StopPostHook is the unit's ExecStopPost= work: the network and secret
// copies go (StopPost); then, if the guest rebooted into a QEMU told to
// exit on reboot, its guardian starts it again.
func (s *Supervisor) StopPostHook(ctx context.Context, name, unit string) (string, error) {
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
