package spec

import (
	"slices"
	"time"
)

// What a guest panic, a QEMU crash or a silent watchdog does, and the console
// log's bounds: the VM's failure handling, all top-level keys but [console].

// Panic policies (on_panic). Unset: no pvpanic device, the guest kernel
// handles its own panic (QEMU never hears of it).
const (
	PanicPoweroff = "poweroff" // QEMU ends; the VM stays off
	PanicRestart  = "restart"  // QEMU ends and a new one starts, within the restart limit
	PanicPause    = "pause"    // the guest stops; vmsup resume resets it and runs it again
	PanicPreserve = "preserve" // the guest stops and is kept as it is for inspection (no resume)
)

// Crash policies (on_crash): QEMU itself dying by a signal or a failed exit.
const (
	CrashStop    = "stop"    // default: the VM stays crashed until up
	CrashRestart = "restart" // start it again, within the restart limit
)

// Watchdog actions (watchdog): QEMU's -action watchdog=, taken when the
// guest opened the i6300esb watchdog and stopped feeding it.
var watchdogActions = []string{"reset", "shutdown", "poweroff", "pause", "inject-nmi", "debug", "none"}

// Restart limit defaults: Incus's boot.autorestart gives up after 10
// restarts in a minute; a guest that panics at boot must not loop forever.
const (
	DefaultRestartLimit  = 10
	DefaultRestartWindow = time.Minute
	MaxRestartLimit      = 1000
)

// Console bounds the serial console's log: the current file and
// LogFiles-1 older ones, each at most LogSize, so a guest printing in a
// loop never holds more than LogFiles × LogSize of the host's disk.
type Console struct {
	LogSize  Size `toml:"log_size"`  // default "1M", at least "64K"
	LogFiles int  `toml:"log_files"` // default 2 (the current and one older), at most 100
}

// Console log defaults and bounds.
const (
	DefaultConsoleLogSize  = 1 * MiB
	DefaultConsoleLogFiles = 2
	MinConsoleLogSize      = 64 * KiB
	MaxConsoleLogFiles     = 100
)

func (vm *VM) applyFailureDefaults() {
	if vm.OnCrash == "" {
		vm.OnCrash = CrashStop
	}
	if vm.RestartLimit == 0 {
		vm.RestartLimit = DefaultRestartLimit
	}
	if vm.RestartWindow == 0 {
		vm.RestartWindow = Duration(DefaultRestartWindow)
	}
	if vm.Console.LogSize == 0 {
		vm.Console.LogSize = DefaultConsoleLogSize
	}
	if vm.Console.LogFiles == 0 {
		vm.Console.LogFiles = DefaultConsoleLogFiles
	}
}

func (f *File) validateFailure() error {
	vm := &f.VM
	switch vm.OnPanic {
	case "", PanicPoweroff, PanicRestart, PanicPause, PanicPreserve:
	default:
		return f.Errorf("on_panic", "unknown policy %q (want \"restart\", \"poweroff\", \"pause\" or \"preserve\")", vm.OnPanic)
	}
	switch vm.OnCrash {
	case CrashStop, CrashRestart:
	default:
		return f.Errorf("on_crash", "unknown policy %q (want \"stop\" or \"restart\")", vm.OnCrash)
	}
	if vm.RestartLimit < 1 || vm.RestartLimit > MaxRestartLimit {
		return f.Errorf("restart_limit", "%d is out of range 1..%d", vm.RestartLimit, MaxRestartLimit)
	}
	if vm.RestartWindow <= 0 || vm.RestartWindow.D() > 24*time.Hour {
		return f.Errorf("restart_window", "%s is out of range: more than 0s, at most 24h", vm.RestartWindow.D())
	}
	if vm.Watchdog != "" && !slices.Contains(watchdogActions, vm.Watchdog) {
		return f.Errorf("watchdog", "unknown action %q (want one of %q)", vm.Watchdog, watchdogActions)
	}
	if err := f.validateWatchdogModel(); err != nil {
		return err
	}
	if c := vm.Console; c.LogSize < MinConsoleLogSize || c.LogSize%KiB != 0 {
		return f.Errorf("console.log_size", "%s must be a whole number of KiB, at least 64K", c.LogSize)
	}
	if c := vm.Console; c.LogFiles < 1 || c.LogFiles > MaxConsoleLogFiles {
		return f.Errorf("console.log_files", "%d is out of range 1..%d", c.LogFiles, MaxConsoleLogFiles)
	}
	return nil
}

// Watchdog models (watchdog_model).
const (
	WatchdogI6300ESB = "i6300esb"
	WatchdogITCO     = "itco"
	WatchdogIB700    = "ib700"
)

var watchdogModels = []string{WatchdogI6300ESB, WatchdogITCO, WatchdogIB700}

// validateWatchdogModel: a known model, with an action to take, and the
// TCO watchdog only on q35 (it is part of q35's ICH9 chipset).
func (f *File) validateWatchdogModel() error {
	vm := &f.VM
	switch {
	case vm.WatchdogModel == "":
		return nil
	case !slices.Contains(watchdogModels, vm.WatchdogModel):
		return f.Errorf("watchdog_model", "unknown model %q (want one of %q)", vm.WatchdogModel, watchdogModels)
	case vm.Watchdog == "":
		return f.Errorf("watchdog_model", "needs watchdog, the action QEMU takes when the guest stops feeding it")
	case vm.WatchdogModel == WatchdogITCO && MachineFamily(vm.Machine) != MachineQ35:
		return f.Errorf("watchdog_model", "%q is q35's chipset watchdog; machine %q has none (use \"i6300esb\" or \"ib700\")", vm.WatchdogModel, vm.Machine)
	}
	return nil
}
