package companion

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// A bounded console log with no process per VM while the guest is quiet:
// QEMU writes the serial console's log into a FIFO (its chardev's
// logfile=) that a socket unit of the VM holds (units.FIFOSocket, started
// with QEMU's unit in the same D-Bus call, stopped by the next down or
// start once its FIFO is empty: StopConsoleLog). When the
// guest prints, systemd starts the logger (a unit of its own, as QEMU's
// user, sandboxed), which copies the FIFO into the log's files, rotated at
// [console] log_size, log_files kept (internal/console/consolelog), and ends after
// loggerIdle without output; what the guest prints next waits in the FIFO
// and starts it again. QEMU cannot bound a logfile itself, and a guest
// printing in a loop would otherwise fill the host's disk.

// HookConsoleLog is the logger's command: "SELF console-log --idle D --max
// BYTES --keep N LOG", the FIFO its fd 3 (socket activation).
const HookConsoleLog = "console-log"

// loggerIdle is how long the logger waits for more output before it ends:
// long enough that a guest printing a line a second does not start one
// per line, short enough that a booted, quiet guest has none.
const loggerIdle = 3 * time.Second

// firstWriterWait bounds how long a logger given a FIFO path (--fifo, the
// form before socket activation) waits for its QEMU to open it.
const firstWriterWait = 2 * time.Minute

// logUnit is a logger unit of the VM unit vmUnit:
// "vmsup-log@NAME:RUN.service", and "vmsup-log@NAME:migrated:RUN.service"
// for the alternate unit of a local migration; its socket is the same
// name's .socket. RUN is new at each start: the last QEMU's logger may
// still be copying its last lines, and its socket may not be collected
// yet, when the next QEMU of the VM starts.
func logUnit(vmUnit, run string) string {
	return strings.TrimSuffix(unitName("log", vmUnit), ".service") + ":" + run + ".service"
}

// StopConsoleLog stops the console socket of VM unit vmUnit once its FIFO
// is empty (units.DrainFIFO), and removes the FIFO: after its QEMU, which
// may have written its last words just before it ended. No FIFO (the
// usual case: the last down did this): nothing to do.
func (c Companions) StopConsoleLog(ctx context.Context, p vmstore.Paths, vmUnit string) error {
	fifo := FIFO(p, vmUnit)
	if _, err := os.Lstat(fifo); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// A log that loses its last lines is better than a VM that cannot
	// start or stop: a drain that fails is only noted by the socket's end.
	_ = units.DrainFIFO(ctx, fifo)
	sd, err := c.Systemd(ctx)
	if err != nil {
		return err
	}
	for _, sock := range c.consoleSockets(ctx, sd, fifo, vmUnit) {
		// Collected once stopped (CollectMode=): no reset.
		if err := sd.Stop(ctx, sock); err != nil {
			return err
		}
	}
	os.Remove(fifo + ".unit")
	if err := os.Remove(fifo); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// consoleSockets are the console sockets that may hold fifo: the one its
// start named in FIFO.unit (checked: the directory is QEMU's user's), else
// those systemd lists for vmUnit (each start's has a name of its own).
func (c Companions) consoleSockets(ctx context.Context, sd *units.Manager, fifo, vmUnit string) []string {
	pattern := strings.TrimSuffix(logUnit(vmUnit, "??????"), ".service") + ".socket"
	if b, err := os.ReadFile(fifo + ".unit"); err == nil {
		if name := strings.TrimSpace(string(b)); matchName(pattern, name) {
			return []string{name}
		}
	}
	socks, err := sd.List(ctx, pattern)
	if err != nil {
		return nil
	}
	var out []string
	for _, st := range socks {
		out = append(out, st.Name)
	}
	return out
}

func matchName(pattern, name string) bool {
	ok, err := path.Match(pattern, name)
	return ok && err == nil
}

// FIFOMode is the console FIFO's mode. systemd makes it root's, and
// QEMU's user, if it has one (confined), writes it as "others": the state
// directory, QEMU's user's and 0700, keeps everyone else out. Not
// SocketUser=: systemd 252 chowns the path after making it, in a
// directory QEMU's user could put a symlink in.
func FIFOMode(confined bool) uint32 {
	if confined {
		return 0o602
	}
	return 0o600
}

// LoggerPattern matches the console loggers of VM name (its sockets with
// ".socket" for ".service").
func LoggerPattern(name string) string { return "vmsup-log@" + name + ":*.service" }

// runID is a new start's RUN: 6 random hex digits.
func runID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// FIFO is the FIFO the QEMU of vmUnit writes its console log into: each
// QEMU its own, so a local migration's two never share one.
func FIFO(p vmstore.Paths, vmUnit string) string {
	if a, ok := alt(vmUnit); ok {
		return filepath.Join(p.Dir, "console-"+a+".fifo")
	}
	return filepath.Join(p.Dir, "console.fifo")
}

// Config is the VM's console log: its files and bounds (the defaults for
// vm nil).
func Config(p vmstore.Paths, vm *spec.VM) consolelog.Config {
	c := consolelog.Default(p.ConsoleLog)
	if vm != nil && vm.Console.LogSize > 0 && vm.Console.LogFiles > 0 {
		c.MaxBytes, c.Keep = int64(vm.Console.LogSize), vm.Console.LogFiles
	}
	return c
}

// prepareConsoleLog readies the log for QEMU's unit, and adds its FIFO
// socket and logger to that unit (started with it: no D-Bus call here,
// unless the last QEMU of this unit's socket was left listening).
func (c Companions) prepareConsoleLog(ctx context.Context, f *spec.File, plan *startplan.Plan) error {
	p := plan.Paths
	fifo := FIFO(p, plan.Unit)
	// systemd makes the FIFO anew, and refuses one not made by it (QEMU's
	// user's, before socket activation).
	if err := c.StopConsoleLog(ctx, p, plan.Unit); err != nil {
		return fmt.Errorf("console log: %w", err)
	}
	cfg := Config(p, &f.VM)
	if plan.Mode == startplan.Fresh {
		// A new guest: its log starts anew (the last run's is kept as .1).
		if err := consolelog.StartRun(cfg); err != nil {
			return fmt.Errorf("console log: %w", err)
		}
	}
	sb, uid, gid, err := c.user(f.VM.Name, p)
	if err != nil {
		return fmt.Errorf("console log: %w", err)
	}
	if sb != nil {
		// The logger runs as QEMU's user: the files vmsup made as root
		// (this start's, or given back to root at the last down) are its.
		if err := consolelog.Chown(cfg, uid, gid); err != nil {
			return fmt.Errorf("console log: %w", err)
		}
	}
	unit := logUnit(plan.Unit, runID())
	logger := units.Unit{Name: unit, Description: "vmsup: console log of " + f.VM.Name, Collect: true,
		Argv: []string{c.Self, HookConsoleLog, "--idle", loggerIdle.String(), "--max", strconv.FormatInt(cfg.MaxBytes, 10),
			"--keep", strconv.Itoa(cfg.Keep), cfg.Path},
		// Not a lower CPU share: QEMU waits for the logger once the FIFO
		// is full, so a starved logger would stall the guest's console.
		TasksMax: 16, MemoryMax: 64 << 20, UMask: 0o077, // the guest's console: its owner's only
		// Not Before= QEMU's unit: a loaded unit's dependency keeps the
		// other loaded, and the next start of the VM could not make it.
		// SIGTERM (host shutdown) does not end it before it is idle
		// (RunConsoleLog): the guest's last lines still reach the log.
		Sandbox: loggerSandbox(sb, p, c.Self)}
	sock := units.FIFOSocket{Name: strings.TrimSuffix(unit, ".service") + ".socket",
		Description: "vmsup: console FIFO of " + f.VM.Name, Path: fifo, Mode: FIFOMode(sb != nil), Service: logger}
	// Whoever stops it next finds it by this (StopConsoleLog).
	if err := os.WriteFile(fifo+".unit", []byte(sock.Name+"\n"), 0o600); err != nil {
		return fmt.Errorf("console log: %w", err)
	}
	plan.AddUnit(func(u *units.Unit) { u.FIFOSockets = append(u.FIFOSockets, sock) })
	return nil
}

// loggerSandbox confines the logger as its QEMU's user (sb, from user;
// nil: unconfined): it sees of the host's VM files only its own state
// directory, where it writes the log and rotates it (a rename in that
// directory), and the vmsup binary it runs; no network, no capabilities.
func loggerSandbox(sb *units.Sandbox, p vmstore.Paths, self string) *units.Sandbox {
	if sb == nil {
		return nil
	}
	s := *sb
	s.ReadWritePaths, s.BindPaths = []string{p.Dir}, []string{p.Dir}
	s.HidePaths = []string{filepath.Dir(p.Dir)} // every VM's state directory
	s.ReadOnlyBindPaths = []string{self}
	s.HostNetwork, s.Devices, s.AppArmorProfile, s.AllowWriteExecute = false, nil, "", false
	return &s
}

// RunConsoleLog is the logger's work (HookConsoleLog's arguments after the
// command): copy the FIFO into the log until it stays empty for --idle
// (given as fd 3 by its socket), or, given --fifo, until its QEMU closes it.
func RunConsoleLog(ctx context.Context, args []string) error {
	fl := flag.NewFlagSet(HookConsoleLog, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	fifo := fl.String("fifo", "", "")
	idle := fl.Duration("idle", loggerIdle, "")
	maxBytes := fl.Int64("max", consolelog.DefaultMaxBytes, "")
	keep := fl.Int("keep", consolelog.DefaultKeep, "")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() != 1 {
		return fmt.Errorf("want one log path, got %q", args)
	}
	cfg := consolelog.Config{Path: fl.Arg(0), MaxBytes: *maxBytes, Keep: *keep}
	if *fifo != "" {
		return consolelog.Run(ctx, *fifo, cfg, firstWriterWait)
	}
	in, err := listenedFIFO()
	if err != nil {
		return err
	}
	defer in.Close()
	// Not ended by SIGTERM (ctx): at host shutdown the logger stops while
	// its QEMU may still print its last lines; it ends when idle, as ever.
	return consolelog.Serve(context.WithoutCancel(ctx), in, cfg, *idle)
}

// listenedFIFO is the FIFO systemd passed (socket activation: fd 3), made
// non-blocking so that reads can time out.
func listenedFIFO() (*os.File, error) {
	if pid, _ := strconv.Atoi(os.Getenv("LISTEN_PID")); pid != os.Getpid() || os.Getenv("LISTEN_FDS") != "1" {
		return nil, errors.New("no FIFO: not started by its socket with one (LISTEN_PID, LISTEN_FDS), and no --fifo")
	}
	const fd = 3 // SD_LISTEN_FDS_START
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	return os.NewFile(fd, "console FIFO"), nil
}
