package snapshottest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// The guest writes pattern i (8 digits) at 16 KiB * i of /dev/vda, for
// i < patterns: spread over the disk, so the mirror copies around them.
const patterns = 400

// writer writes the patterns i+base in the guest's background, then
// writes "done" to /tmp/writer.
func writer(base int) string {
	return fmt.Sprintf(`rm -f /tmp/writer; (i=0; while [ $i -lt %d ]; do printf %%08d $((i+%d)) | dd of=/dev/vda bs=4096 seek=$((i*4)) conv=notrunc 2>/dev/null; i=$((i+1)); done; sync; echo done > /tmp/writer) >/dev/null 2>&1 & true`, patterns, base)
}

// checker reads the patterns back past the guest's page cache and says
// how many differ from i+base (BAD=N).
func checker(base int) string {
	return fmt.Sprintf(`echo 3 > /proc/sys/vm/drop_caches; i=0; bad=0; while [ $i -lt %d ]; do v=$(dd if=/dev/vda bs=4096 skip=$((i*4)) count=1 2>/dev/null | head -c 8); [ "$v" = "$(printf %%08d $((i+%d)))" ] || bad=$((bad+1)); i=$((i+1)); done; echo BAD=$bad`, patterns, base)
}

// TestDiskMove: on a guest writing patterns to a raw data disk,
//   - a move cancelled by its context, and one cancelled by
//     CancelDiskMove: the disk stays on its image, the target is gone;
//   - a move whose command is killed during the copy: the next command
//     recovers (no job, no target), the guest runs on;
//   - a move while the guest writes: every pattern reads back, the old
//     image is closed, the record names the new one and the next boot
//     opens it;
//   - an attached disk moved, then detached.
func TestDiskMove(t *testing.T) {
	ctx := supervisortest.Context(t, 8*time.Minute)
	dir := t.TempDir()
	data := filepath.Join(dir, "data.raw")
	sup := supervisortest.New(t, env, "", vmsupBin)
	images := filepath.Join(sup.Root(), "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "mvvm.toml")
	supervisortest.WriteGuestTOML(t, env, path, "mvvm", fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nsize = \"16M\"\n", data))
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mvvm") })
	st, err := sup.Status(ctx, "mvvm")
	if err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) string {
		t.Helper()
		sh := supervisortest.Shell(t, ctx, st)
		defer sh.Close() // an idle console client stalls the guest's output
		out, _, err := sh.Run(ctx, cmd)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		return out
	}
	// First other values: a write the move lost would leave one.
	run(writer(1000))
	waitWriter(t, run)
	if out := run(checker(1000)); !strings.Contains(out, "BAD=0") {
		t.Fatalf("before any move the guest reads %s", out)
	}

	if unlocked(data) || !openBy(st, data) {
		t.Fatalf("before the move: %s not locked (%v) or not open by QEMU", data, unlocked(data))
	}
	moveCancels(t, ctx, sup, data, images)
	moveKilled(t, ctx, sup, data, images, run)

	// The move, with the guest writing all along.
	target := filepath.Join(images, "data.qcow2")
	run(writer(0))
	var reports []supervisor.MoveProgress
	start := time.Now()
	res, err := sup.MoveDisk(ctx, "mvvm", "data", supervisor.MoveOptions{To: target, Speed: 8 << 20,
		Progress: func(p supervisor.MoveProgress) { reports = append(reports, p) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("move in %s: %+v (%d progress reports, last %+v)", time.Since(start), res, len(reports), reports[len(reports)-1])
	waitWriter(t, run)
	if out := run("sync; " + checker(0)); !strings.Contains(out, "BAD=0") {
		t.Fatalf("after the move the guest reads %s", out)
	}
	st, _ = sup.Status(ctx, "mvvm")
	if !unlocked(data) || openBy(st, data) {
		t.Fatalf("QEMU still has %s open after the move", data)
	}
	if !openBy(st, target) {
		t.Fatalf("QEMU does not have %s open", target)
	}
	if len(st.MovedDisks) != 1 || !strings.Contains(st.MovedDisks[0], target) || st.Disks[0].Source != target {
		t.Fatalf("status after the move: moved %v, disks %+v", st.MovedDisks, st.Disks)
	}

	// The old image is no longer needed and goes (the unit was started
	// naming it): systemctl stop still powers the guest off by ACPI with
	// both stop hooks (issue 45: they failed with 226/NAMESPACE).
	if err := os.Rename(data, data+".old"); err != nil {
		t.Fatal(err)
	}
	supervisortest.StopByUnit(t, ctx, env.Systemd, "mvvm")
	// The next boot opens the new image.
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	st, _ = sup.Status(ctx, "mvvm")
	if out := run(checker(0)); !strings.Contains(out, "BAD=0") {
		t.Fatalf("after down and up the guest reads %s", out)
	}
	if !openBy(st, target) || exists(data) {
		t.Fatalf("the new boot does not run on %s (or made %s again)", target, data)
	}

	movePivotKilled(t, ctx, sup, target, images, run)
	moveAttached(t, ctx, sup, images)
}

// movePivotKilled: a move killed right after its pivot is finished by the
// next command: recorded, the old image closed.
func movePivotKilled(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, from, images string, run func(string) string) {
	target := filepath.Join(images, "data3.raw")
	cmd := exec.CommandContext(ctx, os.Args[0], "-move-helper", sup.Root(), env.Systemd.BusAddress, vmsupBin, "mvvm", "data", target, "pivot")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("the helper was not killed:\n%s", out)
	}
	st, err := sup.Status(ctx, "mvvm")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovery after the pivot: %s", st.Recovery)
	if len(st.MovedDisks) != 1 || !strings.HasSuffix(st.MovedDisks[0], target) || !unlocked(from) || !openBy(st, target) {
		t.Fatalf("after recovery: moved %v, %s unlocked %v, %s open %v", st.MovedDisks, from, unlocked(from), target, openBy(st, target))
	}
	assertNoJobs(t, ctx, sup)
	if out := run(checker(0)); !strings.Contains(out, "BAD=0") {
		t.Fatalf("after the recovered pivot the guest reads %s", out)
	}
}

// moveCancels cancels two moves of data: by their context once the copy
// runs, and with CancelDiskMove.
func moveCancels(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, data, images string) {
	for i, how := range []string{"context", "CancelDiskMove"} {
		target := filepath.Join(images, fmt.Sprintf("cancel%d.qcow2", i))
		mctx, cancel := context.WithCancel(ctx)
		started := false
		o := supervisor.MoveOptions{To: target, Speed: 1 << 20, Progress: func(p supervisor.MoveProgress) {
			if started {
				return
			}
			started = true
			if how == "context" {
				cancel()
				return
			}
			go func() {
				if err := sup.CancelDiskMove(ctx, "mvvm", "data"); err != nil {
					t.Errorf("CancelDiskMove: %v", err)
				}
			}()
		}}
		_, err := sup.MoveDisk(mctx, "mvvm", "data", o)
		cancel()
		t.Logf("move cancelled by %s: %v", how, err)
		if err == nil || !started {
			t.Fatalf("move cancelled by %s: err %v, job started %v", how, err, started)
		}
		if exists(target) {
			t.Fatalf("cancelled by %s: %s is left", how, target)
		}
		if unlocked(data) {
			t.Fatalf("cancelled by %s: QEMU no longer holds %s", how, data)
		}
		assertNoJobs(t, ctx, sup)
	}
}

// moveKilled runs a move in a child process that dies right after the
// mirror started; the next command (status) recovers.
func moveKilled(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, data, images string, run func(string) string) {
	target := filepath.Join(images, "killed.qcow2")
	cmd := exec.CommandContext(ctx, os.Args[0], "-move-helper", sup.Root(), env.Systemd.BusAddress, vmsupBin, "mvvm", "data", target, "mirror")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the helper did not die by SIGKILL: %v\n%s", err, out)
	}
	st, err := sup.Status(ctx, "mvvm")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovery: %s", st.Recovery)
	if !strings.Contains(st.Recovery, "disk-move") || st.State != supervisor.StateRunning {
		t.Fatalf("status after the kill: recovery %q, state %s", st.Recovery, st.State)
	}
	assertNoJobs(t, ctx, sup)
	if exists(target) || unlocked(data) {
		t.Fatalf("after recovery: %s left %v, %s unlocked %v", target, exists(target), data, unlocked(data))
	}
	if out := run(checker(1000)); !strings.Contains(out, "BAD=0") {
		t.Fatalf("after the recovered move the guest reads %s", out)
	}
}

// moveAttached moves a hot-plugged disk, then detaches it: the detach
// finds the nodes the move made.
func moveAttached(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, images string) {
	hot, hot2 := filepath.Join(images, "hot.qcow2"), filepath.Join(images, "hot2.raw")
	if _, err := sup.AttachDisk(ctx, "mvvm", spec.Disk{Name: "hot", File: hot, Format: spec.FormatQcow2, Size: 8 << 20,
		Type: spec.DiskFile, Cache: "writeback", AIO: "threads"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.MoveDisk(ctx, "mvvm", "hot", supervisor.MoveOptions{To: hot2}); err != nil {
		t.Fatal(err)
	}
	st, _ := sup.Status(ctx, "mvvm")
	if !unlocked(hot) || !openBy(st, hot2) {
		t.Fatalf("after moving hot: %s unlocked %v, %s open %v", hot, unlocked(hot), hot2, openBy(st, hot2))
	}
	if err := sup.DetachDisk(ctx, "mvvm", "hot"); err != nil {
		t.Fatal(err)
	}
	if openBy(st, hot2) {
		t.Fatalf("%s still open after the detach", hot2)
	}
	// The detached image is deleted: vmsup down powers the guest off by
	// ACPI and the unit's stop hooks still run after it.
	if err := os.Remove(hot2); err != nil {
		t.Fatal(err)
	}
	supervisortest.DownByACPI(t, ctx, sup, env.Systemd, "mvvm")
}

func waitWriter(t *testing.T, run func(string) string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(run("cat /tmp/writer 2>/dev/null; echo"), "done") {
		if time.Now().After(deadline) {
			t.Fatal("the guest's writer did not finish")
		}
		time.Sleep(time.Second)
	}
}

func assertNoJobs(t *testing.T, ctx context.Context, sup *supervisor.Supervisor) {
	t.Helper()
	reply, err := sup.QMP(ctx, "mvvm", []byte(`{"execute":"query-jobs"}`), false)
	if err != nil || strings.Contains(string(reply), `"id"`) {
		t.Fatalf("query-jobs: %s %v", reply, err)
	}
}

// unlocked: no QEMU holds image's write lock.
func unlocked(image string) bool {
	locked, err := storage.WriteLocked(image)
	return err == nil && !locked
}

// openBy: a process of the VM's unit (host PIDs: the sandbox has its own
// PID namespace) has file open.
func openBy(st supervisor.Status, file string) bool {
	pids, _ := env.Systemd.HostPIDs(st.Unit)
	for _, pid := range pids {
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
		for _, fd := range fds {
			if l, err := os.Readlink(fd); err == nil && l == file {
				return true
			}
		}
	}
	return false
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// moveHelper runs in a child process: a move of DISK of VM to TARGET
// (slow, 1 MiB/s, unless it is killed after the pivot), killing itself with SIGKILL right after the named
// step, as if vmsup died there.
func moveHelper(args []string) int {
	root, bus, self, vm, disk, target, killAfter := args[0], args[1], args[2], args[3], args[4], args[5], args[6]
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: bus, Self: self, AllowPaths: testenv.AllowPaths(), BlockDirs: testenv.BlockDirs(),
		AfterStep: func(_, step string) {
			if step == killAfter {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	speed := int64(1 << 20) // still copying when killed after "mirror"
	if killAfter == "pivot" {
		speed = 0 // no need to wait for the copy
	}
	_, err = sup.MoveDisk(context.Background(), vm, disk, supervisor.MoveOptions{To: target, Speed: speed})
	fmt.Println("the move ended without the kill:", err)
	return 1
}
