package upgradetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/lifecycle/memstate"
	"github.com/vmsup/vmsup/internal/vm/backupchain"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestUpgradeLocal: a guest running on QEMU 7.2, with a disk snapshot, a
// memory snapshot and a backup chain (full + incremental) taken there;
// QEMU 10 put in place under it; `vmsup migrate --local` moves it onto 10
// (same machine type, counter uninterrupted), the chain goes on
// incrementally on 10, the disk snapshot and the memory snapshot (the
// state 7.2 wrote) revert on 10, and every backup point restores with 10's
// tools to the guest's data then.
func TestUpgradeLocal(t *testing.T) {
	testenv.QEMU10Skip(t)
	t0 := time.Now()
	ctx := supervisortest.Context(t, 12*time.Minute)
	dir := t.TempDir()
	v := &localVM{t: t, ctx: ctx, name: "upg", root: filepath.Join(dir, "root"), backups: filepath.Join(dir, "backups")}
	v.sup = newSup(t, v.root)
	supervisortest.UpTOML(t, ctx, v.sup, dir, v.name, guestBody(v.name, filepath.Join(dir, "data.qcow2"), ""))
	v.st = status(t, ctx, v.sup, v.name)
	supervisortest.Shell(t, ctx, v.st).Close()
	v.qemu72 = stat(t, env.QEMU)
	v.pid72 = v.expect("on 7.2", v.qemu72, "7").PID
	elapsed(t, "guest up on 7.2", t0)

	v.on72()
	elapsed(t, "snapshots and backups on 7.2", t0)
	tu := time.Now()
	v.upgrade()
	v.migrateLocal()
	elapsed(t, "upgrade, migration and backup on 10", tu)
	tr := time.Now()
	v.reverts()
	elapsed(t, "reverts on 10", tr)

	// Every point, restored by QEMU 10's qemu-img.
	want := map[int][]string{1: {"MEM1", "AAAA", "", ""}, 2: {"MEM1", "AAAA", "BBBB", ""}, 3: {"MEM1", "AAAA", "BBBB", "CCCC"}}
	for p := 1; p <= 3; p++ {
		img := restoreRaw(t, ctx, v.sup, v.backups, p)
		for i, w := range want[p] {
			expectPattern(t, img, p, 2*i, w)
		}
	}
	if dr, err := v.sup.Down(ctx, v.name); err != nil || dr.Step != supervisor.StoppedACPI {
		t.Fatalf("down on 10: %+v %v", dr, err)
	}
	elapsed(t, "TestUpgradeLocal", t0)
}

// localVM is TestUpgradeLocal's guest, its supervisor and what the test
// took of it.
type localVM struct {
	t              *testing.T
	ctx            context.Context
	sup            *supervisor.Supervisor
	name, root     string
	st             supervisor.Status
	backups        string      // the backup directory
	lo, hi         int         // the counter just before and after the memory snapshot
	qemu72, qemu10 os.FileInfo // the binaries
	pid72          int         // the QEMU 7.2 that ran the guest first
}

// expect checks the QEMU that runs the guest: binary, major version, the
// machine type pinned at its first start.
func (v *localVM) expect(what string, binary os.FileInfo, major string) qemuRun {
	v.t.Helper()
	r := runningQEMU(v.t, v.ctx, env.Systemd, v.sup, v.name)
	expectQEMU(v.t, what, r, binary, major, "pc-q35-7.2")
	return r
}

// on72 takes, on QEMU 7.2, a disk snapshot, a memory snapshot, a full and
// an incremental backup, each after its own writes.
func (v *localVM) on72() {
	t, ctx := v.t, v.ctx
	guestWrite(t, ctx, v.st, "DISK1", 0)
	if _, err := v.sup.Snapshot(ctx, v.name, "d1", supervisor.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	guestWrite(t, ctx, v.st, "MEM1", 0)
	v.lo = supervisortest.LastCounter(t, v.st.ConsoleLog)
	m1, err := v.sup.Snapshot(ctx, v.name, "m1", supervisor.SnapshotOptions{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	v.hi = supervisortest.LastCounter(t, v.st.ConsoleLog)
	checkState72(t, m1.Memory)
	takeBackup(t, ctx, v.sup, v.name, v.backups, "AAAA", 2, false, v.st)
	takeBackup(t, ctx, v.sup, v.name, v.backups, "BBBB", 4, true, v.st)
}

// upgrade puts QEMU 10's files over 7.2's for systemd, the running QEMU
// and this test (and so every vmsup command it runs): the running QEMU
// keeps its binary and runs on, and vmsup's probe sees QEMU 10.
func (v *localVM) upgrade() {
	t, ctx := v.t, v.ctx
	putQEMU10(t, ctx, env.Systemd.PID1, true)
	putQEMU10(t, ctx, v.pid72, false)
	putQEMU10(t, ctx, os.Getpid(), true)
	v.qemu10 = stat(t, env.QEMU)
	if os.SameFile(v.qemu10, v.qemu72) || !os.SameFile(v.qemu10, stat(t, testenv.QEMU10Binary())) {
		t.Fatalf("%s is not QEMU 10's file after the upgrade", env.QEMU)
	}
	v.expect("after the upgrade, before the migration", v.qemu72, "7")
	n := supervisortest.LastCounter(t, v.st.ConsoleLog)
	supervisortest.CheckContinuous(t, supervisortest.WaitCounterPast(t, v.st.ConsoleLog, n+3, 30*time.Second))
	checkProbe(t, ctx, v.sup, v.root)
}

// migrateLocal runs `vmsup migrate --local` as an operator would after the
// upgrade: the guest runs on QEMU 10, uninterrupted, its data there, and
// its backup chain goes on from 7.2's bitmap, which the migration carried.
func (v *localVM) migrateLocal() {
	t, ctx := v.t, v.ctx
	n := supervisortest.LastCounter(t, v.st.ConsoleLog)
	var mig struct {
		Event  string                   `json:"event"`
		Result supervisor.MigrateResult `json:"result"`
	}
	tm := time.Now()
	cli(t, ctx, v.root, &mig, "migrate", v.name, "--local")
	elapsed(t, "vmsup migrate --local onto 10", tm)
	t.Logf("migration: %s %+v", mig.Event, mig.Result)
	if r10 := v.expect("after migrate --local", v.qemu10, "10"); r10.PID == v.pid72 {
		t.Fatalf("the same QEMU (pid %d) runs the guest", r10.PID)
	}
	// Uninterrupted since the guest booted on 7.2: through the snapshots,
	// the backups, the upgrade and the migration.
	supervisortest.CheckContinuous(t, supervisortest.WaitCounterPast(t, v.st.ConsoleLog, n+10, 30*time.Second))
	if got := guestRead(t, ctx, v.st, 4); got != "BBBB" {
		t.Fatalf("data after the migration: %q at 4 MiB, want BBBB", got)
	}
	takeBackup(t, ctx, v.sup, v.name, v.backups, "CCCC", 6, true, v.st)
}

// reverts reverts, on QEMU 10, the disk snapshot (the guest boots on its
// data then) and the memory snapshot of 7.2 (the guest resumes where it
// was, no boot in between).
func (v *localVM) reverts() {
	t, ctx, log := v.t, v.ctx, v.st.ConsoleLog
	if _, err := v.sup.RevertSnapshot(ctx, v.name, "d1", true); err != nil {
		t.Fatal(err)
	}
	supervisortest.Shell(t, ctx, v.st).Close()
	v.expect("after reverting d1", v.qemu10, "10")
	if d0, d2 := guestRead(t, ctx, v.st, 0), guestRead(t, ctx, v.st, 2); d0 != "DISK1" || d2 != "" {
		t.Fatalf("after reverting d1 the guest reads %q at 0 MiB and %q at 2 MiB, want DISK1 and nothing", d0, d2)
	}
	off := markOf(log)
	rm, err := v.sup.RevertSnapshot(ctx, v.name, "m1", true)
	if err != nil {
		t.Fatal(err)
	}
	if !rm.Restored {
		t.Fatalf("reverting m1 did not restore the memory: %+v", rm)
	}
	v.expect("after reverting m1", v.qemu10, "10")
	c := waitCounterSince(t, log, off, 3)
	if out := since(log, off); strings.Contains(out, "Linux version") {
		t.Fatalf("the guest booted again after the memory revert:\n%s", supervisortest.Tail(out, 2000))
	}
	if c[0] < v.lo || c[0] > v.hi+3 {
		t.Fatalf("after reverting m1 the counter printed %d first; at the snapshot it was %d..%d", c[0], v.lo, v.hi)
	}
	if got := guestRead(t, ctx, v.st, 0); got != "MEM1" {
		t.Fatalf("after reverting m1 the guest reads %q at 0 MiB, want MEM1", got)
	}
}

// checkState72: the memory state is 7.2's: a plain stream (no mapped-ram)
// of machine pc-q35-7.2.
func checkState72(t testing.TB, path string) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	h, err := memstate.ReadHeader(fh)
	if err != nil || h.Machine != "pc-q35-7.2" || h.MappedRAM() {
		t.Fatalf("memory state %s: %+v %v; want 7.2's (pc-q35-7.2, no mapped-ram)", path, h, err)
	}
}

// checkProbe: vmsup's host probe, whose record of 7.2 was cached before
// the upgrade, sees QEMU 10 now (the record's key is the binary's
// identity), in a new supervisor as in one made before the upgrade.
func checkProbe(t testing.TB, ctx context.Context, old *supervisor.Supervisor, root string) {
	t.Helper()
	size := stat(t, testenv.QEMU10Binary()).Size()
	for _, s := range []struct {
		what string
		sup  *supervisor.Supervisor
	}{{"a supervisor made before the upgrade", old}, {"a new supervisor", newSup(t, root)}} {
		c, err := s.sup.HostCaps(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(c.QEMU.Version, "10.") || c.Key.QEMUSize != size {
			t.Errorf("%s: the host probe's record after the upgrade is of QEMU %q (binary of %d bytes), want 10's (%d bytes)",
				s.what, c.QEMU.Version, c.Key.QEMUSize, size)
		}
	}
}

// takeBackup writes word at MiB off and takes a backup point into dir:
// full, or incremental (which it must be).
func takeBackup(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, name, dir, word string, off int, incremental bool, st supervisor.Status) {
	t.Helper()
	guestWrite(t, ctx, st, word, off)
	r, err := sup.Backup(ctx, name, supervisor.BackupOptions{Dir: dir, Incremental: incremental})
	if err != nil {
		t.Fatal(err)
	}
	d := r.Disks[0]
	t.Logf("point %d: %s, %d bytes copied (%s)", r.Point, d.Mode, d.Copied, d.Reason)
	if want := map[bool]string{false: backupchain.Full, true: backupchain.Incremental}[incremental]; d.Mode != want {
		t.Fatalf("point %d is %s (%s), want %s", r.Point, d.Mode, d.Reason, want)
	}
}

// restoreRaw restores point n of dir into a raw file and returns it.
func restoreRaw(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, dir string, n int) []byte {
	t.Helper()
	to := filepath.Join(t.TempDir(), fmt.Sprintf("p%d.raw", n))
	r, err := sup.Restore(ctx, supervisor.RestoreOptions{Dir: dir, Point: n, To: to, Format: "raw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore of point %d: chain %v in %s", n, r.Chain, r.Duration)
	b, err := os.ReadFile(to)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// expectPattern checks the restored image's MiB at off: word's pattern,
// or zeros for "".
func expectPattern(t testing.TB, img []byte, n, off int, word string) {
	t.Helper()
	got := img[off*mib : (off+1)*mib]
	want := make([]byte, mib)
	if word != "" {
		want = bytes.Repeat([]byte(word+"\n"), mib/(len(word)+1)+1)[:mib]
	}
	if !bytes.Equal(got, want) {
		t.Errorf("point %d at %d MiB: got %q..., want %q...", n, off, got[:12], want[:12])
	}
}
