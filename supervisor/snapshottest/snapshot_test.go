package snapshottest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestSnapshots: on one guest writing patterns to a raw disk:
//   - a disk-only snapshot, more writes, a revert (--force of the running
//     VM): the guest reads the pattern of snapshot time;
//   - a memory snapshot: its state file is written the way this QEMU takes
//     it (checkStateWay), and after its revert the guest's counter goes on
//     from its value at snapshot time, with no boot in between;
//   - both snapshots removed live (block-commit): the data stays, and the
//     disk's own file holds it again.
func TestSnapshots(t *testing.T) {
	ctx := supervisortest.Context(t, 6*time.Minute)
	dir := t.TempDir()
	data := filepath.Join(dir, "data.raw")
	body := fmt.Sprintf(`name = "snapvm"
memory = "192M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "16M"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.counter"
`, data, env.Guest.Kernel, env.Guest.Initrd)
	sup, f, st := upVM(t, ctx, "", dir, "snapvm", body)
	sh := supervisortest.Shell(t, ctx, st)
	write := func(sh *testenv.GuestShell, pattern string) {
		t.Helper()
		if _, _, err := sh.Run(ctx, "printf "+pattern+" > /dev/vda && sync"); err != nil {
			t.Fatal(err)
		}
	}
	read := func(sh *testenv.GuestShell) string {
		t.Helper()
		out, _, err := sh.Run(ctx, "echo 3 > /proc/sys/vm/drop_caches; head -c 8 /dev/vda; echo")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	waitAgent(t, ctx, sup, "snapvm")
	write(sh, "PATTERN1")
	r, err := sup.Snapshot(ctx, "snapvm", "s1", supervisor.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("s1: %+v", r)
	if !strings.HasPrefix(r.Quiesced, "fsfreeze") {
		t.Errorf("s1 was not quiesced by the guest agent: %s", r.Quiesced)
	}
	if _, err := sup.Snapshot(ctx, "snapvm", "s1", supervisor.SnapshotOptions{}); err == nil || !strings.Contains(err.Error(), `snapshot "s1" exists`) {
		t.Fatalf("a second snapshot s1: %v", err)
	}
	write(sh, "PATTERN2")
	if got := read(sh); !strings.Contains(got, "PATTERN2") {
		t.Fatalf("after the second write the guest reads %q", got)
	}
	if _, err := sup.RevertSnapshot(ctx, "snapvm", "s1", false); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("revert of a running VM without force: %v", err)
	}
	rr, err := sup.RevertSnapshot(ctx, "snapvm", "s1", true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("revert s1: %+v", rr)
	sh = supervisortest.Shell(t, ctx, st)
	if got := read(sh); !strings.Contains(got, "PATTERN1") || strings.Contains(got, "PATTERN2") {
		t.Fatalf("after the revert to s1 the guest reads %q, want PATTERN1", got)
	}
	sh.Close() // a console client that does not read stalls the guest's counter

	// Memory: the counter goes on from where the snapshot caught it.
	boot := markOf(st.ConsoleLog)                                       // the revert started QEMU again: a new log
	waitCounter(t, st.ConsoleLog, mark{ino: boot.ino}, 20, time.Minute) // well past a fresh boot's
	before := counters(st.ConsoleLog, mark{ino: boot.ino})
	m, err := sup.Snapshot(ctx, "snapvm", "m1", supervisor.SnapshotOptions{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	after := counters(st.ConsoleLog, mark{ino: boot.ino})
	lo, hi := before[len(before)-1], after[len(after)-1]
	t.Logf("m1: %+v (counter %d..%d)", m, lo, hi)
	checkStateWay(t, m.Memory)
	waitCounter(t, st.ConsoleLog, mark{ino: boot.ino}, hi+10, time.Minute)
	off := markOf(st.ConsoleLog)
	rm, err := sup.RevertSnapshot(ctx, "snapvm", "m1", true)
	if err != nil {
		t.Fatal(err)
	}
	if !rm.Restored {
		t.Fatalf("revert to m1 did not restore the memory: %+v", rm)
	}
	c := waitCounter(t, st.ConsoleLog, off, 0, time.Minute)
	if out := since(st.ConsoleLog, off); strings.Contains(out, "Linux version") {
		t.Fatalf("the guest booted again after the memory revert:\n%s", supervisortest.Tail(out, 2000))
	}
	if c[0] < lo || c[0] > hi+3 {
		t.Fatalf("after the memory revert the counter printed %d first; at the snapshot it was %d..%d", c[0], lo, hi)
	}
	t.Logf("revert m1 in %s: counter resumed at %d", rm.Duration, c[0])
	// Again, after a restart each time: the state fits the VM's devices
	// for as long as it runs the same spec (the start's generation, which
	// a restart or a revert counts up, is not part of it).
	for i := 2; i <= 3; i++ {
		if _, err := sup.Restart(ctx, f); err != nil {
			t.Fatal(err)
		}
		off = markOf(st.ConsoleLog)
		if rm, err = sup.RevertSnapshot(ctx, "snapvm", "m1", true); err != nil || !rm.Restored {
			t.Fatalf("revert %d to m1 after a restart: %+v %v", i, rm, err)
		}
		c = waitCounter(t, st.ConsoleLog, off, 0, time.Minute)
		if c[0] < lo || c[0] > hi+3 {
			t.Fatalf("after revert %d to m1 the counter printed %d first; at the snapshot it was %d..%d", i, c[0], lo, hi)
		}
	}

	// Live removal of both: block-commit down into data.raw.
	for _, tag := range []string{"m1", "s1"} {
		if err := sup.RemoveSnapshot(ctx, "snapvm", tag, nil); err != nil {
			t.Fatal(err)
		}
	}
	tree, err := sup.SnapshotTree("snapvm")
	if err != nil || !tree.Empty() {
		t.Fatalf("tree after removing all: %+v %v", tree, err)
	}
	// The restored guest did not boot: its shell waits already (no marker
	// in this QEMU's log).
	sh, err = testenv.DialConsole(ctx, st.Console)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if got := read(sh); !strings.Contains(got, "PATTERN1") {
		t.Fatalf("after removing the snapshots the guest reads %q", got)
	}
	// The unit was started (by the restarts) with both overlays, which the
	// merges deleted: systemctl stop still powers the guest off by ACPI
	// and both stop hooks run (issue 45: they failed with 226/NAMESPACE).
	sh.Close()
	supervisortest.StopByUnit(t, ctx, env.Systemd, "snapvm")
	if st, err := sup.Status(ctx, "snapvm"); err != nil || st.State != supervisor.StateShutOff {
		t.Fatalf("after systemctl stop: %s (%s) %v", st.State, st.Reason, err)
	}
	raw, err := os.ReadFile(data)
	if err != nil || !strings.HasPrefix(string(raw), "PATTERN1") {
		t.Fatalf("data.raw after the merges starts %q (%v)", raw[:8], err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*@*"))
	images, _ := filepath.Glob(filepath.Join(sup.Root(), "images", "*@*"))
	if len(left)+len(images) > 0 {
		t.Fatalf("overlays left after removing every snapshot: %v %v", left, images)
	}
}

// waitAgent waits until the guest agent answers (it starts a few seconds
// after the shell under TCG).
func waitAgent(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := sup.GuestPing(ctx, name)
		if err == nil && st.Error == "" {
			return
		}
		if err == nil {
			err = errors.New(st.Error)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest agent did not answer: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestSnapshotRefusals: a VM with a read-only disk (no guest OS: nothing
// needs to boot) gets a one-line refusal naming the disk, and runs on.
func TestSnapshotRefusals(t *testing.T) {
	ctx := supervisortest.Context(t, 2*time.Minute)
	dir := t.TempDir()
	ro := filepath.Join(dir, "ro.raw")
	if err := os.WriteFile(ro, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`name = "refvm"
memory = "64M"
accel = "tcg"
stop_timeout = "1ms"
guest_agent = false

[[disk]]
name = "data"
file = %q
size = "8M"

[[disk]]
name = "ro"
file = %q
read_only = true
`, filepath.Join(dir, "data.raw"), ro)
	path := filepath.Join(dir, "refvm.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sup := supervisortest.New(t, env, "", vmsupBin)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "refvm") })
	_, err = sup.Snapshot(ctx, "refvm", "a", supervisor.SnapshotOptions{})
	if err == nil || !strings.Contains(err.Error(), `disk "ro" is read-only`) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("snapshot of a VM with a read-only disk: %v", err)
	}
	if st, err := sup.Status(ctx, "refvm"); err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("after the refusal the VM is %s (%v)", st.State, err)
	}
	if tree, err := sup.SnapshotTree("refvm"); err != nil || !tree.Empty() {
		t.Fatalf("tree after the refusal: %+v %v", tree, err)
	}
}
