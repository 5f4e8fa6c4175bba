package supervisor_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/lifecycle/virtiofs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
	"github.com/vmsup/vmsup/units"
)

// companionMax is the highest systemd-analyze security figure of a unit
// vmsup makes, unless its case says why not.
const companionMax = 2.0

// TestUnitExposure measures systemd-analyze security of every unit vmsup
// makes: a VM's (with a TPM and a virtiofs share, so its console logger,
// swtpm and virtiofsd run beside it), the metrics endpoint's and
// collector's instances, and the guardians. Each is at most companionMax,
// the VM's at most maxExposure; the guardians run as root, unconfined, and
// the case says why.
func TestUnitExposure(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	root, dir := t.TempDir(), t.TempDir()
	share := filepath.Join(dir, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU,
		HostCaps: env.Caps, JournalDir: env.Systemd.JournalDir, Self: vmsupBin, SystemdAnalyze: analyzeCmd(),
		AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs, UnitDir: env.Systemd.UnitDir})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	// virtiofsd runs beside QEMU where it is installed; elsewhere its unit
	// is measured as vmsup makes it, running sleep.
	_, noVirtioFSD := caps.VirtioFSD()
	virtiofsShare := fmt.Sprintf("[[share]]\npath = %q\ntag = \"data\"\ndriver = \"virtiofs\"\n", share)
	if noVirtioFSD != nil {
		virtiofsShare = ""
	}
	// Nothing to boot: SeaBIOS waits; the units are what is measured.
	f := supervisortest.LoadTOML(t, dir, "expo", fmt.Sprintf(`name = "expo"
memory = "128M"
accel = "tcg"
stop_timeout = "1s"
guest_agent = false
[tpm]
[[disk]]
name = "d"
file = %q
size = "1M"
format = "raw"
%s`, filepath.Join(dir, "d.raw"), virtiofsShare))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Kill(ctx, "expo")
	// The endpoint's instances run this binary as a dynamic user.
	if err := os.Chmod(filepath.Dir(vmsupBin), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := l.Addr().String()
	l.Close()
	if err := sup.InstallMetrics(ctx, supervisor.MetricsInstall{Listen: listen, Self: vmsupBin}); err != nil {
		t.Fatal(err)
	}
	defer sup.UninstallMetrics(ctx)
	shapes := sup.GuardianUnits("expo")
	guardians := []string{shapes[0].Name, shapes[1].Name}
	if noVirtioFSD != nil {
		t.Logf("virtiofsd's unit measured running sleep: %v", noVirtioFSD)
		shapes = append(shapes, virtiofsShape(t, ctx, root, share))
	}
	startShapes(t, ctx, shapes)
	unconfined := "root, unconfined: it does the work of the vmsup command it stands in for (stop, resume or start " +
		"the VM's QEMU, with taps, ACL grants, AppArmor profiles and QEMU users)"
	for _, c := range []struct {
		unit string
		max  float64
		why  string // why not companionMax
	}{
		{"vmsup-expo.service", maxExposure, ""},
		{loggerUnit(t, ctx, "expo"), companionMax, ""},
		{"vmsup-tpm@expo.service", companionMax, ""},
		{"vmsup-fs-data@expo.service", companionMax, ""},
		{"vmsup-metrics@probe.service", companionMax, ""},
		{"vmsup-metrics-collect@probe.service", companionMax, ""},
		{guardians[0], 10, unconfined},
		{guardians[1], 10, unconfined},
	} {
		e, err := units.AnalyzeSecurity(ctx, analyzeCmd(), "", c.unit)
		if err != nil {
			t.Errorf("%s: %v", c.unit, err)
			continue
		}
		if c.why != "" {
			t.Logf("%-40s %.1f %s: %s", c.unit, e.Level, e.Rating, c.why)
		} else {
			t.Logf("%-40s %.1f %s; open: %s", c.unit, e.Level, e.Rating, strings.Join(e.Open, " "))
		}
		if e.Level > c.max {
			t.Errorf("%s: exposure %.1f %s is above %.1f; open: %s", c.unit, e.Level, e.Rating, c.max, strings.Join(e.Open, " "))
		}
	}
}

// loggerUnit is the console logger unit of VM vm's QEMU: loaded with its
// socket, running or not.
func loggerUnit(t *testing.T, ctx context.Context, vm string) string {
	out, err := env.Systemd.Systemctl(ctx, "list-units", "--all", "--plain", "--no-legend", companion.LoggerPattern(vm))
	f := strings.Fields(string(out))
	if err != nil || len(f) == 0 {
		t.Fatalf("no console logger unit of %s: %v", vm, err)
	}
	return f[0]
}

// virtiofsShape is the unit vmsup makes for share "data" of VM expo under
// root (its QEMU's user: swtpm's), for a host without virtiofsd.
func virtiofsShape(t *testing.T, ctx context.Context, root, share string) units.Unit {
	out, err := env.Systemd.Systemctl(ctx, "show", "-p", "User", "--value", "vmsup-tpm@expo.service")
	if err != nil {
		t.Fatal(err)
	}
	qemuUser := strings.TrimSpace(string(out))
	p := virtiofs.PathsFor(filepath.Join(root, "vms", "expo"), "data")
	if err := os.Mkdir(p.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return virtiofs.Unit("vmsup-fs-data@expo.service", "expo", "vmsup-expo.service", "/bin/sleep",
		spec.Share{Path: share, Tag: "data", Driver: spec.ShareVirtioFS}, p, filepath.Join(root, "vms"),
		&units.Sandbox{User: qemuUser, Group: qemuUser})
}

// startShapes starts each unit as vmsup makes it, running sleep, until the
// test ends.
func startShapes(t *testing.T, ctx context.Context, shapes []units.Unit) {
	sd, err := units.Connect(ctx, env.Systemd.BusAddress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sd.Close)
	for _, u := range shapes {
		u.Argv = []string{"/bin/sleep", "300"}
		if err := sd.Start(ctx, u); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sd.Stop(context.WithoutCancel(ctx), u.Name) })
	}
}
