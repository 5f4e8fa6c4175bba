package snapshottest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// crashHelper runs in a child process: a snapshot (ROOT BUS SELF VM TAG
// MEMORY STEP), or a backup (the same with TAG the backup directory and
// MEMORY "backup" or "backup-incremental"), or an NBD export (TAG the
// socket, MEMORY "nbd"), or a forced revert to TAG (MEMORY "revert"),
// killing itself with SIGKILL right after the named step, as if vmsup
// died there.
func crashHelper(args []string) int {
	root, bus, self, name, tag, memory, killAfter := args[0], args[1], args[2], args[3], args[4], args[5], args[6]
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
	switch {
	case memory == "revert":
		_, err = sup.RevertSnapshot(context.Background(), name, tag, true)
	case memory == "nbd": // TAG is the socket
		err = sup.ExportNBD(context.Background(), name, supervisor.ExportOptions{Socket: tag})
	case strings.HasPrefix(memory, "backup"):
		_, err = sup.Backup(context.Background(), name, supervisor.BackupOptions{Dir: tag, Incremental: memory == "backup-incremental"})
	default:
		_, err = sup.Snapshot(context.Background(), name, tag, supervisor.SnapshotOptions{Memory: memory == "memory"})
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

// TestSnapshotKilled: vmsup killed after each step of a snapshot (the
// overlays' nodes added; the guest frozen; the disks switched; the memory
// saved with the guest paused): the guest keeps running, is thawed and
// resumed by the next command, and the snapshot is recorded exactly when
// the disks had switched (otherwise no overlay is left).
func TestSnapshotKilled(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	dir := t.TempDir()
	body := fmt.Sprintf(`name = "crashvm"
memory = "128M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "8M"

# A filesystem for the guest agent to freeze (with none frozen, qemu-ga
# does not stay frozen).
[[disk]]
name = "fs"
file = %q
size = "8M"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, filepath.Join(dir, "data.qcow2"), filepath.Join(dir, "fs.raw"), env.Guest.Kernel, env.Guest.Initrd)
	root := t.TempDir()
	sup, _, st := upVM(t, ctx, root, dir, "crashvm", body)
	sh := supervisortest.Shell(t, ctx, st)
	out, _, err := sh.Run(ctx, "mke2fs -q /dev/vdb && mkdir -p /mnt/fs && mount -t ext2 /dev/vdb /mnt/fs && echo MOUNTED")
	canFreeze := err == nil && strings.Contains(out, "MOUNTED")
	if !canFreeze {
		t.Logf("SKIP part: the test guest cannot mount an ext2 filesystem (%q): with nothing to freeze qemu-ga does not stay frozen, so the kill while frozen shows only a thawed guest after recovery", out)
	}
	sh.Close()
	waitAgent(t, ctx, sup, "crashvm")
	for _, c := range []struct {
		tag, memory, step string
		recorded          bool
	}{
		{"k-nodes", "", "nodes", false},
		{"k-frozen", "", "frozen", false},
		{"k-switch", "", "switch", true},
		{"k-paused", "memory", "paused", false},
		{"k-memory", "memory", "switch", true},
	} {
		cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", root, env.Systemd.BusAddress, vmsupBin, "crashvm", c.tag, c.memory, c.step)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s: the helper was not killed after %s: %v\n%s", c.tag, c.step, err, out)
		}
		// What the kill left, before anyone recovers it.
		sock := filepath.Join(root, "vms", "crashvm", "qga.sock")
		if c.step == "frozen" && canFreeze {
			if fs := freezeStatus(t, ctx, sock); fs != "frozen" {
				t.Fatalf("%s: killed while frozen, the guest is %s", c.tag, fs)
			}
		}
		if c.step == "paused" {
			if out, err := sup.QMP(ctx, "crashvm", []byte(`{"execute":"query-status"}`), false); err != nil || !strings.Contains(string(out), `"paused"`) {
				t.Fatalf("%s: killed while paused, QEMU says %s (%v)", c.tag, out, err)
			}
		}
		// The next command recovers (under the VM's lock).
		if err := sup.Pause(ctx, "crashvm"); err != nil {
			t.Fatalf("%s: next command: %v", c.tag, err)
		}
		if err := sup.Resume(ctx, "crashvm"); err != nil {
			t.Fatal(err)
		}
		tree, err := sup.SnapshotTree("crashvm")
		if err != nil {
			t.Fatal(err)
		}
		if got := tree.Find(c.tag) != nil; got != c.recorded {
			t.Fatalf("%s: recorded %v after a kill after %s, want %v", c.tag, got, c.step, c.recorded)
		}
		if !c.recorded {
			if left, _ := filepath.Glob(filepath.Join(root, "images", "*@"+c.tag+"*")); len(left) > 0 {
				t.Fatalf("%s: overlays left: %v", c.tag, left)
			}
		}
		st, err := sup.Status(ctx, "crashvm")
		if err != nil || st.State != supervisor.StateRunning {
			t.Fatalf("%s: the guest is %s (%v)", c.tag, st.State, err)
		}
		if fs := freezeStatus(t, ctx, sock); fs != "thawed" {
			t.Fatalf("%s: the guest's filesystems are %s after recovery", c.tag, fs)
		}
		t.Logf("%s: killed after %s: recorded=%v, guest running and thawed", c.tag, c.step, c.recorded)
	}
	// The recorded ones are real: the VM reverts to one.
	if _, err := sup.RevertSnapshot(ctx, "crashvm", "k-switch", true); err != nil {
		t.Fatal(err)
	}
	if tree, _ := sup.SnapshotTree("crashvm"); !strings.EqualFold(tree.Current, "k-switch") {
		t.Fatalf("current after revert: %q", tree.Current)
	}
}

// freezeStatus asks the guest agent directly whether the filesystems are
// frozen.
func freezeStatus(t *testing.T, ctx context.Context, sock string) string {
	t.Helper()
	a, err := qmp.DialAgent(ctx, sock, qmp.WithoutSymlink())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s, err := a.FSFreezeStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
