package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// The counter guest's helpers (supervisortest), under the names these
// tests use.
func migGuest(t testing.TB, dir, name, memory, disk string) *spec.File {
	t.Helper()
	return supervisortest.MigrationGuest(t, env, dir, name, memory, disk)
}

func guestExec(t testing.TB, ctx context.Context, consoleSock, cmd string) string {
	t.Helper()
	return supervisortest.GuestExec(t, ctx, consoleSock, cmd)
}

func writeGuestData(t testing.TB, ctx context.Context, consoleSock, token string) {
	t.Helper()
	supervisortest.WriteGuestData(t, ctx, consoleSock, token)
}

func readGuestData(t testing.TB, ctx context.Context, consoleSock string, n int) string {
	t.Helper()
	return supervisortest.ReadGuestData(t, ctx, consoleSock, n)
}

func waitCounterPast(t testing.TB, log string, n int, d time.Duration) []int {
	t.Helper()
	return supervisortest.WaitCounterPast(t, log, n, d)
}

func checkContinuous(t testing.TB, c []int) {
	t.Helper()
	supervisortest.CheckContinuous(t, c)
}

func lastCounter(t testing.TB, log string) int { return supervisortest.LastCounter(t, log) }

// TestMigrateLocal: a running guest moves into a new QEMU on the same host
// (and back): the counter goes on without a gap, the disk data reads back,
// status follows the new unit, and exactly one QEMU runs afterwards.
func TestMigrateLocal(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	dir := t.TempDir()
	sup := newSup(t, "")
	f := migGuest(t, dir, "mloc", "256M", filepath.Join(dir, "data.raw"))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mloc") })
	st, _ := sup.Status(ctx, "mloc")
	waitConsole(t, st, "VMSUP-SHELL-READY", 90*time.Second)
	writeGuestData(t, ctx, st.Console, "vmsup-local-data-1")
	before := waitCounterPast(t, st.ConsoleLog, 3, 30*time.Second)

	uidBefore := procUID(t, qemuPIDs(t, "mloc"))
	res, err := sup.Migrate(ctx, "mloc", supervisor.MigrateOptions{Local: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("local migration: %+v", res)
	if res.Unit != "vmsup-mloc@migrated.service" {
		t.Fatalf("new unit %q", res.Unit)
	}
	st2, err := sup.Status(ctx, "mloc")
	if err != nil || st2.State != supervisor.StateRunning || st2.Unit != res.Unit {
		t.Fatalf("status after local migration: %+v %v", st2, err)
	}
	pids, _ := env.Systemd.HostPIDs(res.Unit)
	if len(pids) != 1 {
		t.Fatalf("new unit has QEMU pids %v", pids)
	}
	// The new QEMU runs as confined as the old one (same user).
	if uid := procUID(t, pids); uid != uidBefore {
		t.Fatalf("new QEMU runs as uid %s, the old one ran as %s", uid, uidBefore)
	}
	// up with the same file finds the VM under its new unit.
	if ur, err := sup.Up(ctx, f); err != nil || ur[0].Action != supervisor.Unchanged {
		t.Fatalf("up after local migration: %+v %v", ur, err)
	}
	if out, _ := env.Systemd.Systemctl(ctx, "is-active", "vmsup-mloc.service"); strings.TrimSpace(string(out)) == "active" {
		t.Fatalf("old unit still active")
	}
	c := waitCounterPast(t, st.ConsoleLog, before[len(before)-1]+10, 30*time.Second)
	checkContinuous(t, c)
	if got := readGuestData(t, ctx, st2.Console, 18); got != "vmsup-local-data-1" {
		t.Fatalf("data after migration: %q", got)
	}

	// And back to the usual unit name.
	res, err = sup.Migrate(ctx, "mloc", supervisor.MigrateOptions{Local: true, Bandwidth: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if res.Unit != "vmsup-mloc.service" {
		t.Fatalf("second local migration: unit %q", res.Unit)
	}
	if reply, err := sup.QMP(ctx, "mloc", []byte(`{"execute":"query-status"}`), false); err != nil {
		ents, _ := os.ReadDir(st.StateDir)
		for _, e := range ents {
			t.Logf("state dir: %s", e.Name())
		}
		t.Fatalf("QMP after migrating back: %s %v", reply, err)
	}
	n := lastCounter(t, st.ConsoleLog)
	checkContinuous(t, waitCounterPast(t, st.ConsoleLog, n+5, 30*time.Second))
	if dr, err := sup.Down(ctx, "mloc"); err != nil || dr.Step != supervisor.StoppedACPI {
		t.Fatalf("down after migrations: %+v %v", dr, err)
	}
	if st, err := sup.Status(ctx, "mloc"); err != nil || st.State != supervisor.StateShutOff {
		t.Fatalf("status after down: %+v %v", st, err)
	}
}

var _ = errors.Is

// TestMigratePostcopy: a guest dirtying memory faster than a throttled
// precopy can send it switches to postcopy after 2 s and completes; the
// guest runs on the destination during postcopy and the counter goes on.
func TestMigratePostcopy(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	dir := t.TempDir()
	sup := newSup(t, "")
	// The probe says whether this QEMU's user can have userfaultfd (the
	// sysctl, or /dev/userfaultfd from QEMU 8.1): no guest boots for nothing.
	if caps, err := sup.HostCaps(ctx, false); err == nil && !caps.Facts.Userfaultfd.OK {
		t.Skipf("postcopy unavailable to this QEMU: %s", caps.Facts.Userfaultfd.Reason)
	}
	f := migGuest(t, dir, "mpc", "256M", filepath.Join(dir, "data.raw"))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mpc") })
	st, _ := sup.Status(ctx, "mpc")
	waitConsole(t, st, "VMSUP-SHELL-READY", 90*time.Second)
	guestExec(t, ctx, st.Console, "(while :; do dd if=/dev/urandom of=/dirty bs=1M count=16 2>/dev/null; done) >/dev/null 2>&1 & echo $! >/dirty.pid")
	n := lastCounter(t, st.ConsoleLog)
	var statuses []qmp.MigrationStatus
	res, err := sup.Migrate(ctx, "mpc", supervisor.MigrateOptions{Local: true, Bandwidth: 16 << 20, Postcopy: true,
		PostcopyAfter: 2 * time.Second, Timeout: 3 * time.Minute, ProgressInterval: 200 * time.Millisecond,
		Progress: func(p supervisor.MigrationProgress) {
			if len(statuses) == 0 || statuses[len(statuses)-1] != p.Status {
				statuses = append(statuses, p.Status)
			}
		}})
	if err != nil && strings.Contains(err.Error(), "Postcopy is not supported") {
		// QEMU found no userfaultfd its user may use, though the probe
		// thought it could (a sysctl or device mode changed since).
		b, _ := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
		t.Skipf("postcopy unavailable to this QEMU (vm.unprivileged_userfaultfd=%s): %v", strings.TrimSpace(string(b)), err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("postcopy migration: %+v; statuses %v", res, statuses)
	if !res.Postcopy {
		t.Fatalf("did not switch to postcopy (statuses %v)", statuses)
	}
	st2, err := sup.Status(ctx, "mpc")
	if err != nil || st2.State != supervisor.StateRunning || st2.Unit != res.Unit {
		t.Fatalf("status after postcopy: %+v %v", st2, err)
	}
	checkContinuous(t, waitCounterPast(t, st.ConsoleLog, n+20, 30*time.Second))
}

// procUID returns the real uid of the only process in pids.
func procUID(t testing.TB, pids []int) string {
	t.Helper()
	if len(pids) != 1 {
		t.Fatalf("want one QEMU process, got %v", pids)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pids[0])
	return ""
}
