package supervisor_test

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/supervisor"
)

// TestMigrateCPR: on a QEMU with cpr-transfer (QEMU 10; see
// TestMigrateCPRQEMU10), a VM started there records shared RAM, and
// migrate --local has the new QEMU take it in place (mode cpr-transfer):
// the guest's counter goes on, its disk and console answer, there and
// back; --no-cpr copies it and says so. On a QEMU without cpr-transfer
// (7.2) the RAM is copied and the result says why, naming that QEMU.
func TestMigrateCPR(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	dir := t.TempDir()
	sup := newSup(t, "")
	caps, err := sup.HostCaps(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	cpr, why := caps.CPRTransfer()
	f := migGuest(t, dir, "mcpr", "256M", filepath.Join(dir, "data.raw"))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mcpr") })
	st, _ := sup.Status(ctx, "mcpr")
	waitConsole(t, st, "VMSUP-SHELL-READY", 90*time.Second)
	writeGuestData(t, ctx, st.Console, "vmsup-cpr-data-1")
	if ram := recordedRAM(t, st.StateDir); ram == nil || ram.ID != "pc.ram" || ram.Shared != cpr {
		t.Fatalf("QEMU %s: recorded RAM %+v, want pc.ram shared %v", caps.QEMU.Version, ram, cpr)
	}
	before := waitCounterPast(t, st.ConsoleLog, 3, 30*time.Second)

	res, err := sup.Migrate(ctx, "mcpr", supervisor.MigrateOptions{Local: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("QEMU %s: %s, note %q, guest paused %s, QEMU downtime %s, %d bytes sent, wall %s",
		caps.QEMU.Version, res.Mode, res.ModeNote, res.Pause, res.Downtime, res.Transferred, res.Wall)
	if !cpr {
		if res.Mode != supervisor.MigrationModeNormal || !strings.Contains(res.ModeNote, why) {
			t.Fatalf("QEMU %s: mode %q, note %q; want normal because %q", caps.QEMU.Version, res.Mode, res.ModeNote, why)
		}
		checkContinuous(t, waitCounterPast(t, st.ConsoleLog, before[len(before)-1]+10, 30*time.Second))
		return
	}
	if res.Mode != supervisor.MigrationModeCPRTransfer || res.ModeNote != "" || res.Pause <= 0 || res.Unit != "vmsup-mcpr@migrated.service" {
		t.Fatalf("QEMU %s: %+v, want cpr-transfer with the guest's pause", caps.QEMU.Version, res)
	}
	c := waitCounterPast(t, st.ConsoleLog, before[len(before)-1]+10, 30*time.Second)
	checkContinuous(t, c)
	if got := readGuestData(t, ctx, st.Console, 16); got != "vmsup-cpr-data-1" {
		t.Fatalf("data after cpr-transfer: %q", got)
	}
	if ram := recordedRAM(t, st.StateDir); ram == nil || !ram.Shared {
		t.Fatalf("after cpr-transfer: recorded RAM %+v", ram)
	}

	// And back to the usual unit, in place again; then copied when asked.
	if res, err = sup.Migrate(ctx, "mcpr", supervisor.MigrateOptions{Local: true}); err != nil || res.Mode != supervisor.MigrationModeCPRTransfer {
		t.Fatalf("second cpr-transfer: %+v %v", res, err)
	}
	n := lastCounter(t, st.ConsoleLog)
	checkContinuous(t, waitCounterPast(t, st.ConsoleLog, n+5, 30*time.Second))
	res, err = sup.Migrate(ctx, "mcpr", supervisor.MigrateOptions{Local: true, NoCPR: true})
	if err != nil || res.Mode != supervisor.MigrationModeNormal || !strings.Contains(res.ModeNote, "no-cpr") {
		t.Fatalf("--no-cpr: %+v %v", res, err)
	}
	t.Logf("--no-cpr: guest paused %s, %d bytes sent", res.Pause, res.Transferred)
	n = lastCounter(t, st.ConsoleLog)
	checkContinuous(t, waitCounterPast(t, st.ConsoleLog, n+5, 30*time.Second))
	if got := readGuestData(t, ctx, st.Console, 16); got != "vmsup-cpr-data-1" {
		t.Fatalf("data after the migrations: %q", got)
	}
}

// recordedRAM is the RAM the VM's record says its QEMU has.
func recordedRAM(t *testing.T, stateDir string) *qemuargs.RAM {
	t.Helper()
	var app vmstore.Applied
	root := filepath.Dir(filepath.Dir(stateDir)) // ROOT/vms/NAME
	b, err := os.ReadFile(vmstore.Store{Root: root}.Paths(filepath.Base(stateDir)).State)
	if err == nil {
		err = json.Unmarshal(b, &app)
	}
	if err != nil {
		t.Fatal(err)
	}
	return app.RAM
}

// TestMigrateCPRQEMU10 runs TestMigrateCPR again under QEMU 10 (this test
// binary, in scripts/testing/with-qemu10's mount namespace) where the
// QEMU at hand has no cpr-transfer: one run covers both QEMUs.
func TestMigrateCPRQEMU10(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	if caps, err := newSup(t, "").HostCaps(ctx, false); err != nil {
		t.Fatal(err)
	} else if ok, _ := caps.CPRTransfer(); ok {
		t.Skipf("QEMU %s here has cpr-transfer: TestMigrateCPR took that path", caps.QEMU.Version)
	}
	prefix := cmp.Or(os.Getenv("VMSUP_QEMU10"), "/opt/vmsup/qemu10")
	if _, err := os.Stat(filepath.Join(prefix, "root/usr/bin/qemu-system-x86_64")); err != nil {
		t.Skipf("no QEMU 10 in %s (bash scripts/install-qemu10.sh puts it there): %v", prefix, err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts/testing/with-qemu10"), os.Args[0],
		"-test.run", "^TestMigrateCPR$", "-test.v", "-test.count=1", "-test.timeout", "9m")
	out, err := cmd.CombinedOutput()
	t.Logf("under QEMU 10:\n%s", tail(string(out), 4000))
	if err != nil || !strings.Contains(string(out), "--- PASS: TestMigrateCPR") || !strings.Contains(string(out), ": cpr-transfer, note") {
		t.Fatalf("TestMigrateCPR under QEMU 10: %v", err)
	}
}
