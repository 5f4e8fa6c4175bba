package snapshottest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/ops/diskops"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestRevertMemoryMismatch: a memory snapshot records the machine type
// it was saved with (its state's header names the same). Once the VM is
// pinned to another type, a revert to it is refused in one line before
// anything is touched. A memory state QEMU refuses to load (its header
// altered to name another machine type, as a state saved by another QEMU
// would) makes the revert give up: one error, the VM off on the
// snapshot's disks (which hold the snapshot's data), the snapshot kept,
// no journal left. The same revert killed after its record is given up by
// the next command's recovery, which then goes on (up boots the VM); then
// down --force, snapshot rm and rm work.
func TestRevertMemoryMismatch(t *testing.T) {
	ctx := supervisortest.Context(t, 8*time.Minute)
	r := &revertRun{t: t, ctx: ctx, dir: t.TempDir(), root: t.TempDir()}
	var st supervisor.Status
	r.sup, _, st = upVM(t, ctx, r.root, r.dir, "rvvm", r.body("q35"))
	sh := supervisortest.Shell(t, ctx, st)
	first := r.pinned()
	if _, err := r.sup.Snapshot(ctx, "rvvm", "m1", supervisor.SnapshotOptions{Memory: true}); err != nil {
		t.Fatal(err)
	}
	m1 := findSnap(t, r.sup, "m1")
	if hdr, err := diskops.StateMachine(m1.Memory); m1.Machine != first || hdr != first || err != nil {
		t.Fatalf("m1 records machine %q, its state's header %q (%v); the VM is pinned to %s", m1.Machine, hdr, err, first)
	}
	sh.Close()

	// Another pinned type: the revert is refused before anything is touched.
	other := "pc-q35-7.1"
	if first == other {
		other = "pc-q35-7.0"
	}
	r.refusedOnOther(first, other)

	// A state QEMU refuses: the revert gives up.
	sh = supervisortest.Shell(t, ctx, r.status())
	r.guest(sh, "printf BEFOREM2 > /dev/vda && sync")
	if _, err := r.sup.Snapshot(ctx, "rvvm", "m2", supervisor.SnapshotOptions{Memory: true}); err != nil {
		t.Fatal(err)
	}
	r.guest(sh, "printf AFTERM2X > /dev/vda && sync")
	sh.Close()
	m2 := findSnap(t, r.sup, "m2")
	alterMachine(t, m2.Memory, other, "pc-q35-6.2")
	_, err := r.sup.RevertSnapshot(ctx, "rvvm", "m2", true)
	if err == nil || !strings.HasPrefix(err.Error(), `vm "rvvm": revert to "m2": the VM did not resume from the snapshot's memory state (`) ||
		!strings.Contains(err.Error(), "off on the snapshot's disks") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("revert to a state QEMU refuses: %v", err)
	}
	t.Logf("gave up: %v", err)
	gaveUp(t, ctx, r.sup, "rvvm", m2.Memory)
	res, err := r.sup.Up(ctx, r.f)
	if err != nil || strings.Contains(res[0].Note, "recovered") {
		t.Fatalf("up after the revert gave up: %+v %v", res, err)
	}
	sh = supervisortest.Shell(t, ctx, r.status())
	if got := r.guest(sh, "echo 3 > /proc/sys/vm/drop_caches; head -c 8 /dev/vda; echo"); !strings.Contains(got, "BEFOREM2") {
		t.Fatalf("the disk after the revert gave up holds %q, want the snapshot's BEFOREM2", got)
	}
	sh.Close()
	r.killedRevert()
}

// revertRun is TestRevertMemoryMismatch's VM: its supervisor, state
// root, directory, and the file it runs now.
type revertRun struct {
	t         *testing.T
	ctx       context.Context
	sup       *supervisor.Supervisor
	dir, root string
	f         *spec.File
}

// body is the VM's file with machine.
func (r *revertRun) body(machine string) string {
	return fmt.Sprintf(`name = "rvvm"
memory = "160M"
accel = "tcg"
stop_timeout = "20s"
machine = %q

[[disk]]
name = "data"
file = %q
size = "8M"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, machine, filepath.Join(r.dir, "data.raw"), env.Guest.Kernel, env.Guest.Initrd)
}

// pinned is the machine type the VM's record pins.
func (r *revertRun) pinned() string {
	r.t.Helper()
	raw, err := os.ReadFile(filepath.Join(r.root, "records", "rvvm", "state.json"))
	var app struct{ Machine string }
	if err != nil || json.Unmarshal(raw, &app) != nil {
		r.t.Fatalf("state.json: %v\n%s", err, raw)
	}
	return app.Machine
}

func (r *revertRun) status() supervisor.Status {
	r.t.Helper()
	st, err := r.sup.Status(r.ctx, "rvvm")
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// guest runs cmd in the guest and fails the test unless it exits 0.
func (r *revertRun) guest(sh *testenv.GuestShell, cmd string) string {
	r.t.Helper()
	out, code, err := sh.Run(r.ctx, cmd)
	if err != nil || code != 0 {
		r.t.Fatalf("guest: %s: %d %v\n%s", cmd, code, err, out)
	}
	return out
}

// refusedOnOther restarts the VM pinned to machine type other: a revert
// to m1 (saved on first) is refused in one line, and the VM runs on, its
// tree and files as they were.
func (r *revertRun) refusedOnOther(first, other string) {
	t, ctx, sup := r.t, r.ctx, r.sup
	if _, err := sup.DownWith(ctx, "rvvm", supervisor.DownOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	r.f = supervisortest.LoadTOML(t, r.dir, "rvvm", r.body(other))
	if _, err := sup.Up(ctx, r.f); err != nil {
		t.Fatal(err)
	}
	if got := r.pinned(); got != other {
		t.Fatalf("pinned %s after up with machine = %q", got, other)
	}
	tree := filepath.Join(r.root, "records", "rvvm", "snapshots.json")
	treeBefore, _ := os.ReadFile(tree)
	filesBefore := entries(t, r.dir)
	_, err := sup.RevertSnapshot(ctx, "rvvm", "m1", true)
	want := fmt.Sprintf("its memory state was saved with machine type %s and the VM is pinned to %s now", first, other)
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("revert to a state of another machine type: %v", err)
	}
	t.Logf("refused: %v", err)
	treeAfter, _ := os.ReadFile(tree)
	if st := r.status(); st.State != supervisor.StateRunning || !bytes.Equal(treeBefore, treeAfter) || entries(t, r.dir) != filesBefore {
		t.Fatalf("a refused revert touched something: state %s, tree changed %v, files %s -> %s", st.State, !bytes.Equal(treeBefore, treeAfter), filesBefore, entries(t, r.dir))
	}
}

// killedRevert kills a revert to m2 (which QEMU refuses) after its record:
// the next command, up, settles it (giving it up) and boots the VM; then
// down --force, snapshot rm and rm work.
func (r *revertRun) killedRevert() {
	t, ctx, sup := r.t, r.ctx, r.sup
	cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", r.root, env.Systemd.BusAddress, vmsupBin, "rvvm", "m2", "revert", "record")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the revert was not killed after its record: %v\n%s", err, out)
	}
	res, err := sup.Up(ctx, r.f)
	if err != nil || !strings.Contains(res[0].Note, "recovered an interrupted snapshot-revert") ||
		!strings.Contains(res[0].Note, "did not resume from the snapshot's memory state") {
		t.Fatalf("up after a killed revert: %+v %v", res, err)
	}
	t.Logf("up after the killed revert: %s", res[0].Note)
	if st := r.status(); st.State != supervisor.StateRunning {
		t.Fatalf("status after up: %+v", st)
	}
	if _, err := sup.DownWith(ctx, "rvvm", supervisor.DownOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"m2", "m1"} {
		if err := sup.RemoveSnapshot(ctx, "rvvm", tag, nil); err != nil {
			t.Fatalf("snapshot rm %s: %v", tag, err)
		}
	}
	if err := sup.Remove(ctx, "rvvm"); err != nil {
		t.Fatal(err)
	}
}

// findSnap is the VM's snapshot tag.
func findSnap(t *testing.T, sup *supervisor.Supervisor, tag string) supervisor.SnapshotInfo {
	t.Helper()
	tree, err := sup.SnapshotTree("rvvm")
	if err != nil {
		t.Fatal(err)
	}
	s := tree.Find(tag)
	if s == nil {
		t.Fatalf("no snapshot %s: %+v", tag, tree)
	}
	return *s
}

// alterMachine makes the state file's header name machine to instead of
// from (the same length), as a state saved on another machine type.
func alterMachine(t *testing.T, path, from, to string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const at = 13 // magic, version, section, length
	if len(from) != len(to) || len(b) < at+len(from) || string(b[at:at+len(from)]) != from {
		t.Fatalf("%s: header %q, want %s at %d", path, b[:min(len(b), 32)], from, at)
	}
	copy(b[at:], to)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// gaveUp checks a VM whose revert gave up: off, not crashed, its disks
// and the snapshot's memory state there, no operation journaled.
func gaveUp(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name, memory string) {
	t.Helper()
	st, err := sup.Status(ctx, name)
	if err != nil || st.State != supervisor.StateShutOff {
		t.Fatalf("status after the revert gave up: %+v %v", st, err)
	}
	tree, err := sup.SnapshotTree(name)
	if err != nil {
		t.Fatal(err)
	}
	for disk, img := range tree.Active {
		if _, err := os.Stat(img.Path); err != nil {
			t.Errorf("disk %s: %v", disk, err)
		}
	}
	if _, err := os.Stat(memory); err != nil {
		t.Errorf("the snapshot's memory state: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sup.Root(), "records", name, "op.json")); err == nil {
		t.Error("the revert's journal is left")
	}
}

// entries lists dir's files, as one string.
func entries(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}
