package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// migGuest writes a spec for a guest that prints a counter every 0.2 s and
// has one raw data disk at disk (shared: both "hosts" see the same /tmp).
func migGuest(t testing.TB, dir, name, memory, disk string) *spec.File {
	t.Helper()
	if err := os.WriteFile(disk, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".toml")
	body := fmt.Sprintf(`name = %q
memory = %q
accel = "tcg"
stop_timeout = "5s"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 vmsup.counter"

[[disk]]
name = "data"
file = %q
format = "raw"
`, name, memory, env.Guest.Kernel, env.Guest.Initrd, disk)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// guestRun runs one shell command in the guest over its console socket.
func guestExec(t testing.TB, ctx context.Context, consoleSock, cmd string) string {
	t.Helper()
	sh, err := testenv.DialConsole(ctx, consoleSock)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, code, err := sh.Run(rctx, cmd)
	if err != nil || code != 0 {
		t.Fatalf("guest %q: exit %d, %v; output %q", cmd, code, err, tail(out, 600))
	}
	return out
}

// writeGuestData writes token at the start of the guest's data disk,
// bypassing nothing: it must reach the image before the migration ends.
func writeGuestData(t testing.TB, ctx context.Context, consoleSock, token string) {
	guestExec(t, ctx, consoleSock, fmt.Sprintf("printf '%%s' %s | dd of=/dev/vda bs=512 conv=fsync,notrunc 2>/dev/null; sync", token))
}

// readGuestData reads the token back from the disk with the page cache
// dropped, so the bytes come from the image as the destination QEMU sees it.
func readGuestData(t testing.TB, ctx context.Context, consoleSock string, n int) string {
	// The counter prints on the same console: fence the data so a counter
	// line landing next to it cannot be taken for part of it.
	out := guestExec(t, ctx, consoleSock, fmt.Sprintf("dmesg -n 1; echo 3 > /proc/sys/vm/drop_caches; printf 'DATA[%%s]\\n' \"$(dd if=/dev/vda bs=512 count=1 2>/dev/null | head -c %d)\"", n))
	m := regexp.MustCompile(`DATA\[([^\]]*)\]`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no DATA[...] in %q", out)
	}
	return m[1]
}

var counterRE = regexp.MustCompile(`VMSUP-COUNTER (\d+)`)

// counters returns the counter values in the console log, in order.
func counters(t testing.TB, log string) []int {
	t.Helper()
	b, _ := os.ReadFile(log)
	var out []int
	for _, m := range counterRE.FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

// waitCounterPast waits until the log shows a counter value > n and returns
// the values.
func waitCounterPast(t testing.TB, log string, n int, d time.Duration) []int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		c := counters(t, log)
		if len(c) > 0 && c[len(c)-1] > n {
			return c
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log)
			t.Fatalf("%s: counter did not pass %d within %s (last values %v); log tail:\n%s", log, n, d, lastN(c, 5), tail(string(b), 1500))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkContinuous fails unless the values go up by exactly one each time.
func checkContinuous(t testing.TB, c []int) {
	t.Helper()
	for i := 1; i < len(c); i++ {
		if c[i] != c[i-1]+1 {
			t.Fatalf("counter jumps from %d to %d (values around: %v)", c[i-1], c[i], c[max(0, i-5):min(len(c), i+5)])
		}
	}
}

func lastN(c []int, n int) []int {
	if len(c) > n {
		return c[len(c)-n:]
	}
	return c
}

func lastCounter(t testing.TB, log string) int {
	c := counters(t, log)
	if len(c) == 0 {
		return -1
	}
	return c[len(c)-1]
}

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
	f := migGuest(t, dir, "mpc", "256M", filepath.Join(dir, "data.raw"))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mpc") })
	st, _ := sup.Status(ctx, "mpc")
	waitConsole(t, st, "VMSUP-SHELL-READY", 90*time.Second)
	guestExec(t, ctx, st.Console, "(while :; do dd if=/dev/urandom of=/dirty bs=1M count=16 2>/dev/null; done) >/dev/null 2>&1 & echo $! >/dirty.pid")
	n := lastCounter(t, st.ConsoleLog)
	var statuses []string
	res, err := sup.Migrate(ctx, "mpc", supervisor.MigrateOptions{Local: true, Bandwidth: 16 << 20, Postcopy: true,
		PostcopyAfter: 2 * time.Second, Timeout: 3 * time.Minute, ProgressInterval: 200 * time.Millisecond,
		Progress: func(p supervisor.MigrationProgress) {
			if len(statuses) == 0 || statuses[len(statuses)-1] != p.Status {
				statuses = append(statuses, p.Status)
			}
		}})
	if err != nil && strings.Contains(err.Error(), "Postcopy is not supported") {
		// QEMU needs userfaultfd, which an unprivileged QEMU gets only with
		// vm.unprivileged_userfaultfd=1 (QEMU 7.2 does not use /dev/userfaultfd).
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
