package companion

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// TestNames: a companion's unit, FIFO and TPM files are its QEMU's unit's:
// a local migration's second QEMU (vmsup-NAME@migrated) has its own.
func TestNames(t *testing.T) {
	p := vmstore.Store{Root: "/r"}.Paths("web")
	for _, c := range []struct{ vmUnit, log, fifo, tpm string }{
		{"vmsup-web.service", "vmsup-log@web:ab12cd.service", p.Dir + "/console.fifo", p.Dir + "/tpm"},
		{"vmsup-web@migrated.service", "vmsup-log@web:migrated:ab12cd.service", p.Dir + "/console-migrated.fifo", p.Dir + "/tpm-migrated"},
	} {
		if got := logUnit(c.vmUnit, "ab12cd"); got != c.log || !matchName(LoggerPattern("web"), got) {
			t.Errorf("%s: logger %s, want %s", c.vmUnit, got, c.log)
		}
		if got := FIFO(p, c.vmUnit); got != c.fifo {
			t.Errorf("%s: FIFO %s, want %s", c.vmUnit, got, c.fifo)
		}
		if got := TPMPaths(p, c.vmUnit); got.Dir != c.tpm || got.Socket != c.tpm+"/ctrl.sock" {
			t.Errorf("%s: TPM %+v, want %s", c.vmUnit, got, c.tpm)
		}
	}
	if got := unitName("fs-docs", "vmsup-web.service"); got != "vmsup-fs-docs@web.service" {
		t.Errorf("virtiofsd unit %s", got)
	}
}

// TestSteps: every QEMU has a console logger; swtpm and virtiofsd only
// with a TPM and virtiofs shares. The argv names the FIFO and socket of
// the unit the start ends up with (known after the steps are listed).
func TestSteps(t *testing.T) {
	c := Companions{Self: "/usr/bin/vmsup"}
	p := vmstore.Store{Root: "/r"}.Paths("web")
	for _, tc := range []struct {
		vm   spec.VM
		want []string
	}{
		{spec.VM{Name: "web"}, []string{StepConsole}},
		{spec.VM{Name: "web", TPM: &spec.TPM{}}, []string{StepConsole, StepTPM}},
		{spec.VM{Name: "web", TPM: &spec.TPM{}, Shares: []spec.Share{{Tag: "docs", Driver: spec.ShareVirtioFS}}},
			[]string{StepConsole, StepTPM, StepVirtioFS}},
		{spec.VM{Name: "web", Shares: []spec.Share{{Tag: "docs", Driver: spec.Share9P}}}, []string{StepConsole}},
	} {
		plan := &startplan.Plan{Paths: p, Unit: "vmsup-web@migrated.service"}
		if got := steps.Names(c.Steps(&spec.File{VM: tc.vm}, plan)); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: steps %q, want %q", tc.vm, got, tc.want)
		}
		plan.Unit = "vmsup-web.service" // the check step's choice
		var o qemuargs.Options
		for _, fn := range plan.ArgvOptions() {
			fn(&o)
		}
		if o.ConsoleLog != p.Dir+"/console.fifo" || o.TPMSocket != p.Dir+"/tpm/ctrl.sock" {
			t.Errorf("argv: console log %s, TPM socket %s", o.ConsoleLog, o.TPMSocket)
		}
	}
}

// TestLoggerSandbox: a confined logger sees its own state directory
// (hidden among the others) and the vmsup binary, nothing of QEMU's
// devices, network or profile; an unconfined QEMU's logger is unconfined.
func TestLoggerSandbox(t *testing.T) {
	p := vmstore.Store{Root: "/r"}.Paths("web")
	if loggerSandbox(nil, p, "/usr/bin/vmsup") != nil {
		t.Fatal("an unconfined QEMU's logger got a sandbox")
	}
	sb := &units.Sandbox{User: "q", Group: "q", HostNetwork: true, AppArmorProfile: "vmsup-web",
		Devices: []units.DeviceRule{{Path: "/dev/kvm", Access: "rw"}}}
	got := loggerSandbox(sb, p, "/usr/bin/vmsup")
	if got.User != "q" || got.HostNetwork || got.Devices != nil || got.AppArmorProfile != "" ||
		!slices.Equal(got.ReadWritePaths, []string{p.Dir}) || !slices.Equal(got.HidePaths, []string{"/r/vms"}) ||
		!slices.Equal(got.ReadOnlyBindPaths, []string{"/usr/bin/vmsup"}) {
		t.Errorf("logger sandbox %+v", got)
	}
	if !sb.HostNetwork || sb.AppArmorProfile == "" {
		t.Errorf("QEMU's sandbox changed: %+v", sb)
	}
}

// TestConfig: [console] log_size and log_files bound the log only
// together; otherwise the defaults.
func TestConfig(t *testing.T) {
	p := vmstore.Store{Root: "/r"}.Paths("web")
	def := Config(p, nil)
	if def.Path != p.ConsoleLog || def.MaxBytes <= 0 || def.Keep <= 0 {
		t.Fatalf("defaults %+v", def)
	}
	vm := &spec.VM{Console: spec.Console{LogSize: spec.MiB, LogFiles: 3}}
	if c := Config(p, vm); c.MaxBytes != int64(spec.MiB) || c.Keep != 3 {
		t.Errorf("bounds %+v", c)
	}
	vm.Console.LogFiles = 0
	if c := Config(p, vm); c != def {
		t.Errorf("half the bounds: %+v, want the defaults", c)
	}
}

// TestRunConsoleLogArgs: the logger refuses a command line it was not
// given by its unit.
func TestRunConsoleLogArgs(t *testing.T) {
	for _, args := range [][]string{{}, {"/log"}, {"--idle", "0s", "/log"}, {"--fifo", "/f"}, {"--fifo", "/f", "a", "b"}, {"--bogus", "x", "/log"}} {
		if err := RunConsoleLog(context.Background(), args); err == nil || strings.Contains(err.Error(), "no such file") {
			t.Errorf("%q: %v", args, err)
		}
	}
}
