package companion

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/consolelog"
	"github.com/vmsup/vmsup/internal/startplan"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// A bounded console log: QEMU writes the serial console's log into a FIFO
// (its chardev's logfile=); one small logger per QEMU (a unit of its own,
// started just before QEMU's, ending when QEMU closes the FIFO) writes it
// into the log's files, rotated at [console] log_size, log_files kept
// (internal/consolelog). QEMU cannot bound a logfile itself, and a guest
// printing in a loop would otherwise fill the host's disk.

// HookConsoleLog is the logger's command: "SELF console-log --fifo F
// --max BYTES --keep N LOG".
const HookConsoleLog = "console-log"

// firstWriterWait bounds how long a logger waits for its QEMU to open the
// FIFO: a logger whose start was killed before QEMU's ends by itself.
const firstWriterWait = 2 * time.Minute

// logUnit is the logger unit of the VM unit vmUnit.
func logUnit(vmUnit string) string { return unitName("log", vmUnit) }

// FIFO is the FIFO the QEMU of vmUnit writes its console log into: each
// QEMU its own, so a local migration's two never share one.
func FIFO(p vmstate.Paths, vmUnit string) string {
	if a, ok := alt(vmUnit); ok {
		return filepath.Join(p.Dir, "console-"+a+".fifo")
	}
	return filepath.Join(p.Dir, "console.fifo")
}

// Config is the VM's console log: its files and bounds (the defaults for
// vm nil).
func Config(p vmstate.Paths, vm *spec.VM) consolelog.Config {
	c := consolelog.Default(p.ConsoleLog)
	if vm != nil && vm.Console.LogSize > 0 && vm.Console.LogFiles > 0 {
		c.MaxBytes, c.Keep = int64(vm.Console.LogSize), vm.Console.LogFiles
	}
	return c
}

// startConsoleLog makes the QEMU's FIFO (QEMU's user owns it) and starts
// its logger.
func (c Companions) startConsoleLog(ctx context.Context, f *spec.File, plan *startplan.Plan) error {
	p := plan.Paths
	fifo := FIFO(p, plan.Unit)
	fi, err := os.Stat(p.Dir)
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if err := consolelog.MakeFIFO(fifo, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("console log: %w", err)
	}
	unit := logUnit(plan.Unit)
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
	u := units.Unit{Name: unit, Description: "vmsup: console log of " + f.VM.Name, Collect: true,
		Argv: []string{c.Self, HookConsoleLog, "--fifo", fifo, "--max", strconv.FormatInt(cfg.MaxBytes, 10),
			"--keep", strconv.Itoa(cfg.Keep), cfg.Path},
		// Not a lower CPU share: QEMU waits for the logger once the FIFO
		// is full, so a starved logger would stall the guest's console.
		TasksMax: 16, MemoryMax: 64 << 20, UMask: 0o077, // the guest's console: its owner's only
		// Stopped after its QEMU at host shutdown: the guest's last lines
		// ("reboot: Power down") still reach the log.
		Before: []string{plan.Unit}, Sandbox: loggerSandbox(sb, p, c.Self)}
	sd, err := c.Systemd(ctx)
	if err != nil {
		return err
	}
	if err := sd.Start(ctx, u); err != nil {
		// A logger left by a start killed before its QEMU opened the FIFO
		// (it would end by itself within firstWriterWait): stop it, again.
		_ = sd.Stop(ctx, unit)
		_ = sd.ResetFailed(ctx, unit)
		if err := sd.Start(ctx, u); err != nil {
			return fmt.Errorf("console log: %w", err)
		}
	}
	return nil
}

// loggerSandbox confines the logger as its QEMU's user (sb, from user;
// nil: unconfined): it sees of the host's VM files only its own state
// directory, where it writes the log and rotates it (a rename in that
// directory), and the vmsup binary it runs; no network, no capabilities.
func loggerSandbox(sb *units.Sandbox, p vmstate.Paths, self string) *units.Sandbox {
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

func (c Companions) stopConsoleLog(ctx context.Context, plan *startplan.Plan) {
	c.stop(ctx, logUnit(plan.Unit))
	os.Remove(FIFO(plan.Paths, plan.Unit))
}

// StopConsoleLog stops the logger of the VM unit vmUnit, if it runs: a
// logger left waiting also keeps its QEMU's unit name loaded in systemd
// (its Before=).
func StopConsoleLog(ctx context.Context, sd *units.Manager, vmUnit string) {
	Stop(ctx, sd, logUnit(vmUnit))
}

// RunConsoleLog is the logger's work (HookConsoleLog's arguments after the
// command): copy the FIFO into the log until its QEMU closes it.
func RunConsoleLog(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(HookConsoleLog, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fifo := fs.String("fifo", "", "")
	maxBytes := fs.Int64("max", consolelog.DefaultMaxBytes, "")
	keep := fs.Int("keep", consolelog.DefaultKeep, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *fifo == "" {
		return fmt.Errorf("want --fifo FIFO and one log path, got %q", args)
	}
	return consolelog.Run(ctx, *fifo, consolelog.Config{Path: fs.Arg(0), MaxBytes: *maxBytes, Keep: *keep}, firstWriterWait)
}
