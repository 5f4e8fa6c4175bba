package supervisor

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmsup/vmsup/internal/machine"
)

// The hook commands a VM's units run (machine.HookStop, ...): HandleHook
// dispatches them, as the front that has every feature wired (a guest's
// reboot applies its pending file through apply).

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
	if len(args) == 0 || (args[0] != machine.HookStop && args[0] != machine.HookPost && args[0] != machine.HookSettle && args[0] != machine.HookRebootApply && args[0] != machine.HookConsoleLog) {
		return 0, false
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	if args[0] == machine.HookConsoleLog {
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
	if args[0] == machine.HookSettle {
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
	case machine.HookStop:
		step, err := s.StopHook(ctx, name, *unit)
		fmt.Fprintf(stdout, "%s %s: %s\n", machine.HookStop, name, step)
		return err
	case machine.HookPost:
		note, err := s.env.StopPostHook(ctx, name, *unit)
		fmt.Fprintf(stdout, "%s %s: %s\n", machine.HookPost, name, note)
		return err
	case machine.HookRebootApply:
		note, err := s.RebootApply(ctx, name)
		fmt.Fprintf(stdout, "%s %s: %s\n", machine.HookRebootApply, name, note)
		return err
	default:
		note, err := s.Settle(ctx, name)
		if note != "" {
			fmt.Fprintf(stdout, "%s: %s\n", name, note)
		}
		return err
	}
}
