package supervisor_test

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

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// loopFS mounts a fresh ext4 filesystem of size bytes at a new directory,
// both here and in the systemd sandbox's mount namespace (QEMU's units see
// the VM's state directory there), and returns the directory.
func loopFS(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "root")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	runCmd(t, "mkfs.ext4", "-q", "-m", "0", img)
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	runCmd(t, "mount", dev, mnt)
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	pid1 := fmt.Sprint(env.Systemd.PID1)
	runCmd(t, "nsenter", "-t", pid1, "-m", "mount", dev, mnt)
	t.Cleanup(func() { exec.Command("nsenter", "-t", pid1, "-m", "umount", "-l", mnt).Run() })
	return mnt
}

// fill takes all but leave bytes of the filesystem at dir; the returned
// func gives them back.
func fill(t *testing.T, dir string, leave int64) func() {
	t.Helper()
	path := filepath.Join(dir, "filler")
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n := int64(st.Bavail)*st.Bsize - leave; n > 0 {
		syscall.Fallocate(int(f.Fd()), 0, 0, n)
	}
	// What fallocate could not take (metadata blocks), in small writes.
	for {
		syscall.Statfs(dir, &st)
		if int64(st.Bavail)*st.Bsize <= leave {
			break
		}
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	return func() { os.Remove(path) }
}

// snapFiles lists the VM's image files and memory states, for a check that a
// refused command left none behind.
func snapFiles(t *testing.T, root, vm string) string {
	t.Helper()
	images, _ := filepath.Glob(filepath.Join(root, "images", vm+"*"))
	states, _ := filepath.Glob(filepath.Join(root, "records", vm, "snapshots", "*"))
	return strings.Join(append(images, states...), " ")
}

// dataImage is the image the VM's data disk runs on.
func dataImage(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string) string {
	t.Helper()
	st, err := sup.Status(ctx, vm)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range st.Disks {
		if d.Name == "data" {
			return d.Image
		}
	}
	t.Fatalf("vm %s has no data disk: %+v", vm, st.Disks)
	return ""
}

// TestFullStateFS: the state root on a small filesystem that is full, then
// nearly full (room for a journal, not for much more): every multi-step
// command either succeeds or fails with one line naming the cause, and
// afterwards the VM is as the fault suite requires: one QEMU, a truthful
// status, no half-made device, grant or tap, and the command can be
// repeated once there is room again.
func TestFullStateFS(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	// Room for the three VMs' boot copies (the test guest's 66 MB
	// uncompressed kernel and its initrd, each VM's own in its state
	// directory) before the fills below.
	root := loopFS(t, 320<<20)
	a := supervisortest.NewSide(t, env, vmsupBin, "A", env.Systemd, root, filepath.Join(root, "etc-systemd"), nil)
	const vm = "ffull"
	h := supervisortest.NewHotVM(t, ctx, env, a.Sup, root, vm, "vmsfullbr0")
	// A second guest, for migrate --local.
	const vm2 = "ffmig"
	f2 := counterGuest(t, t.TempDir(), vm2, "")
	if _, err := a.Sup.Up(ctx, f2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Sup.Down(context.Background(), vm2) })
	// A third with a data disk for the snapshot commands (its overlays go
	// beside its image, on the full filesystem; a memory state in its
	// records), and a snapshot to revert to, taken while there is room.
	const vm3 = "ffsnap"
	f3 := counterGuest(t, t.TempDir(), vm3, fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nsize = \"8M\"\n",
		filepath.Join(root, "images", vm3+"-data.qcow2")))
	if _, err := a.Sup.Up(ctx, f3); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Sup.Down(context.Background(), vm3) })
	if _, err := a.Sup.Snapshot(ctx, vm3, "base", supervisor.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	dropSnap := func(tag string) func(*testing.T, context.Context, supervisor.Status) {
		return func(t *testing.T, ctx context.Context, _ supervisor.Status) {
			if tree, err := a.Sup.SnapshotTree(vm3); err == nil && tree.Find(tag) != nil {
				if err := a.Sup.RemoveSnapshot(ctx, vm3, tag, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	cmds := []struct {
		name string
		run  func(context.Context) error
		undo func(*testing.T, context.Context, supervisor.Status)
	}{
		{"snapshot", func(ctx context.Context) error {
			_, err := a.Sup.Snapshot(ctx, vm3, "full", supervisor.SnapshotOptions{})
			return err
		}, dropSnap("full")},
		{"snapshot-memory", func(ctx context.Context) error {
			_, err := a.Sup.Snapshot(ctx, vm3, "fullm", supervisor.SnapshotOptions{Memory: true})
			return err
		}, dropSnap("fullm")},
		{"revert", func(ctx context.Context) error {
			_, err := a.Sup.RevertSnapshot(ctx, vm3, "base", true)
			return err
		}, nil},
		{"disk-attach", func(ctx context.Context) error { _, err := h.Sup.AttachDisk(ctx, vm, *h.Disk); return err },
			func(t *testing.T, ctx context.Context, st supervisor.Status) {
				if h.HasDisk(st) {
					h.Detach(t, ctx)
				}
				os.Remove(h.Disk.File)
			}},
		{"nic-attach", func(ctx context.Context) error { _, err := h.Sup.AttachNIC(ctx, vm, h.NIC); return err },
			func(t *testing.T, ctx context.Context, st supervisor.Status) {
				if h.HasNIC(st) {
					h.NICDetach(t, ctx)
				}
			}},
		{"set", func(ctx context.Context) error {
			_, err := h.Sup.Resize(ctx, vm, supervisor.ResizeOptions{Memory: supervisortest.BigMem})
			return err
		}, func(t *testing.T, ctx context.Context, st supervisor.Status) {
			if st.Memory != supervisortest.SmallMem.String() {
				h.SetMem(t, ctx, supervisortest.SmallMem)
			}
		}},
		{"migrate-local", func(ctx context.Context) error {
			_, err := h.Sup.Migrate(ctx, vm2, supervisor.MigrateOptions{Local: true})
			return err
		}, nil},
		{"restart", func(ctx context.Context) error { _, err := h.Sup.Restart(ctx, h.File); return err }, nil},
	}
	for _, leave := range []int64{0, 1400 << 10, 4 << 20} {
		for _, c := range cmds {
			t.Run(fmt.Sprintf("%s/free-%dK", c.name, leave>>10), func(t *testing.T) {
				files3 := snapFiles(t, root, vm3)
				img3 := dataImage(t, ctx, a.Sup, vm3)
				unfill := fill(t, root, leave)
				t0 := time.Now()
				err := c.run(ctx)
				took := time.Since(t0)
				unfill()
				switch {
				case err == nil:
					t.Logf("succeeded (%s)", took.Round(time.Millisecond))
				case strings.Contains(err.Error(), "\n"):
					t.Fatalf("error of more than one line: %q", err)
				case !errors.Is(err, syscall.ENOSPC) && !strings.Contains(strings.ToLower(err.Error()), "no space left on device"):
					t.Fatalf("error does not say the filesystem is full: %v", err)
				default:
					t.Logf("refused in %s: %v", took.Round(time.Millisecond), err)
				}
				if c.name == "migrate-local" {
					supervisortest.Settle(t, ctx, vm2, []*supervisortest.Side{a}, "", nil)
					return
				}
				if strings.HasPrefix(c.name, "snapshot") || c.name == "revert" {
					var st supervisor.Status
					supervisortest.Settle(t, ctx, vm3, []*supervisortest.Side{a}, "", &st)
					if err != nil {
						// Refused: on the images it ran on, and nothing left.
						if got := dataImage(t, ctx, a.Sup, vm3); got != img3 {
							t.Fatalf("after the refused %s the disk runs on %s, before on %s", c.name, got, img3)
						}
						if got := snapFiles(t, root, vm3); got != files3 {
							t.Fatalf("after the refused %s: files %s, before %s", c.name, got, files3)
						}
					}
					if c.undo != nil {
						c.undo(t, ctx, st)
					}
					return
				}
				var st supervisor.Status
				on := supervisortest.Settle(t, ctx, vm, []*supervisortest.Side{a}, "", &st)
				h.CheckAll(t, ctx, on, st)
				if c.undo != nil {
					c.undo(t, ctx, st)
				}
			})
		}
	}
}
