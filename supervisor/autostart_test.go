package supervisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestAutostart: vmsup enable installs the boot unit; a reboot (a fresh
// systemd reading the same unit directory and state root) brings the VM up
// through that unit, once per boot; the host's shutdown powers the guest off
// over ACPI; disable removes the unit again.
func TestAutostart(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc") // this "host's" /etc/systemd/system
	root := filepath.Join(dir, "root")
	opts := func(sd *testenv.Systemd) supervisor.Options {
		return supervisor.Options{Root: root, SystemdBus: sd.BusAddress, JournalDir: sd.JournalDir, Self: vmsupBin, QEMU: env.QEMU, HostCaps: env.Caps,
			UnitDir: etc, BootTarget: testenv.BootTarget, RunDir: filepath.Join(dir, "run"), AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs}
	}
	sup, err := supervisor.New(opts(env.Systemd))
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	unitFile := filepath.Join(etc, supervisor.BootUnitName)
	wants := filepath.Join(etc, testenv.BootTarget+".wants", supervisor.BootUnitName)

	// A file that up would refuse marks nothing and installs nothing.
	badPath := filepath.Join(dir, "bad.toml")
	writeGuestTOML(t, badPath, "bootbad", "")
	bad, err := spec.Load(badPath)
	if err != nil {
		t.Fatal(err)
	}
	bad.VM.Boot.Kernel = filepath.Join(dir, "no-such-kernel")
	if _, err := sup.Enable(ctx, bad); err == nil || !strings.Contains(err.Error(), "no-such-kernel") {
		t.Fatalf("enable with a missing kernel: %v", err)
	}
	if _, err := os.Stat(unitFile); !os.IsNotExist(err) {
		t.Fatalf("boot unit written for an invalid file: %v", err)
	}

	f := guestFile(t, dir, "boot1", "")
	for range 2 { // idempotent
		res, err := sup.Enable(ctx, f)
		if err != nil || len(res) != 1 || res[0].File != f.Path {
			t.Fatalf("enable: %+v %v", res, err)
		}
	}
	body, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), "ExecStart="+vmsupBin+" --root "+root) || !strings.Contains(string(body), " autostart\n") {
		t.Fatalf("boot unit:\n%s", body)
	}
	if target, err := os.Readlink(wants); err != nil || target != unitFile {
		t.Fatalf("boot unit not enabled: %q %v", target, err)
	}
	if en, _ := sup.Enabled(); en["boot1"] != f.Path {
		t.Fatalf("enabled: %v", en)
	}

	// Reboot: the VM comes up through the boot unit, with nobody calling vmsup.
	sd2 := bootAgain(t, ctx, etc)
	sup2, err := supervisor.New(opts(sd2))
	if err != nil {
		t.Fatal(err)
	}
	defer sup2.Close()
	st := waitState(t, ctx, sup2, "boot1", supervisor.StateRunning, 60*time.Second)
	if !st.Autostart {
		t.Fatalf("status does not say autostart: %+v", st)
	}
	waitConsole(t, st, "VMSUP-GUEST-READY", 60*time.Second)
	// The oneshot turns active once vmsup autostart has exited, a moment
	// after the VM it started runs.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, _ := sd2.Systemctl(ctx, "show", "-p", "ActiveState,SubState,Result", supervisor.BootUnitName)
		if strings.Contains(string(out), "ActiveState=active") && strings.Contains(string(out), "Result=success") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("boot unit after boot: %s", out)
		}
	}

	// Once per boot: a VM the operator took down stays down when the boot
	// unit runs again.
	if _, err := sup2.Down(ctx, "boot1"); err != nil {
		t.Fatal(err)
	}
	if out, err := sd2.Systemctl(ctx, "restart", supervisor.BootUnitName); err != nil {
		t.Fatalf("restart boot unit: %v %s", err, out)
	}
	if st, _ := sup2.Status(ctx, "boot1"); st.State != supervisor.StateShutOff {
		t.Fatalf("boot unit run again started the VM a second time this boot: %+v", st)
	}

	// Host shutdown: the VM's unit stops gracefully (ACPI), not killed.
	// (QEMU starts each run with a fresh console log.)
	if _, err := sup2.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, st, "VMSUP-GUEST-READY", 60*time.Second)
	if err := sd2.Stop(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	waitConsole(t, st, "reboot: Power down", time.Second)

	// Disable: the mark and, with no VM left, the boot unit go.
	if err := sup.Disable(ctx, "boot1"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{unitFile, wants, filepath.Join(root, "autostart", "boot1.toml")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s left after disable: %v", p, err)
		}
	}

	// autostart = true in the file: up enables it as enable would.
	decl := guestFile(t, dir, "boot2", "autostart = true")
	if _, err := sup.Up(ctx, decl); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(ctx, "boot2")
	if en, _ := sup.Enabled(); en["boot2"] != decl.Path {
		t.Fatalf("up of an autostart = true file did not enable it: %v", en)
	}
	if _, err := os.Stat(unitFile); err != nil {
		t.Fatalf("boot unit: %v", err)
	}
	if err := sup.Disable(ctx, "boot2"); err != nil {
		t.Fatal(err)
	}
}

// bootAgain boots a fresh systemd sandbox that finds units in etc first, as
// a host finds them in /etc/systemd/system.
func bootAgain(t *testing.T, ctx context.Context, etc string) *testenv.Systemd {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmsup-boot-")
	if err != nil {
		t.Fatal(err)
	}
	sd, err := testenv.StartSystemd(ctx, dir, etc)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("second boot: %v", err)
	}
	t.Cleanup(func() { sd.Stop(); os.RemoveAll(dir) })
	return sd
}
