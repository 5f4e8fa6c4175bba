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
	"github.com/vmsup/vmsup/internal/vm/backupchain"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

const mib = 1 << 20

// backupVM starts a guest with a 64 MiB qcow2 data disk (/dev/vda).
func backupVM(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) (*spec.File, string) {
	t.Helper()
	dir := t.TempDir()
	body := fmt.Sprintf(`name = %q
memory = "192M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "64M"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, name, filepath.Join(dir, "data.qcow2"), env.Guest.Kernel, env.Guest.Initrd)
	return supervisortest.UpTOML(t, ctx, sup, dir, name, body), filepath.Join(dir, "data.qcow2")
}

// pattern is what guestWrite writes: word repeated over n bytes.
func pattern(word string, n int) []byte {
	return bytes.Repeat([]byte(word+"\n"), n/(len(word)+1)+1)[:n]
}

// guestWrite writes 1 MiB of word at offset MiB of /dev/vda, synced.
func guestWrite(t *testing.T, ctx context.Context, sh *testenv.GuestShell, word string, off int) {
	t.Helper()
	cmd := fmt.Sprintf("yes %s | head -c %d | dd of=/dev/vda bs=65536 seek=%d conv=notrunc 2>/dev/null && sync", word, mib, off*16)
	if out, code, err := sh.Run(ctx, cmd); err != nil || code != 0 {
		t.Fatalf("guest write %s at %d MiB: %d %v %s", word, off, code, err, out)
	}
}

// restoreRaw restores point n of dir into a raw file and returns it.
func restoreRaw(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, dir string, n int) []byte {
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

// expect checks the restored image's MiB at off: word's pattern, or zeros for "".
func expect(t *testing.T, img []byte, n int, off int, word string) {
	t.Helper()
	got := img[off*mib : (off+1)*mib]
	want := make([]byte, mib)
	if word != "" {
		want = pattern(word, mib)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("point %d at %d MiB: got %q..., want %q...", n, off, got[:12], want[:12])
	}
}

// allocated is the bytes the file takes on disk.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func qmpJSON(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name, cmd string) string {
	t.Helper()
	out, err := sup.QMP(ctx, name, []byte(`{"execute":"`+cmd+`"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// leftovers are the jobs, backup nodes and fd sets QEMU still holds.
func leftovers(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) string {
	t.Helper()
	var left []string
	if j := qmpJSON(t, ctx, sup, name, "query-jobs"); strings.Contains(j, `"id"`) {
		left = append(left, "jobs "+j)
	}
	if f := qmpJSON(t, ctx, sup, name, "query-fdsets"); strings.Contains(f, "vmsup-backup") {
		left = append(left, "fdsets "+f)
	}
	if f := qmpJSON(t, ctx, sup, name, "query-fdsets"); strings.Contains(f, "vmsup-nbd") {
		left = append(left, "nbd fdsets "+f)
	}
	if n := qmpJSON(t, ctx, sup, name, "query-named-block-nodes"); strings.Contains(n, `"bkq-`) || strings.Contains(n, `"bkf-`) {
		left = append(left, "backup nodes")
	}
	if n := qmpJSON(t, ctx, sup, name, "query-named-block-nodes"); strings.Contains(n, `"flq-`) || strings.Contains(n, `"flf-`) {
		left = append(left, "fleece nodes")
	}
	if x := qmpJSON(t, ctx, sup, name, "query-block-exports"); strings.Contains(x, `"id"`) {
		left = append(left, "exports "+x)
	}
	return strings.Join(left, "; ")
}

func bitmapNames(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) []string {
	t.Helper()
	var nodes struct {
		Return []struct {
			Bitmaps []struct {
				Name string `json:"name"`
			} `json:"dirty-bitmaps"`
		} `json:"return"`
	}
	if err := json.Unmarshal([]byte(qmpJSON(t, ctx, sup, name, "query-named-block-nodes")), &nodes); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range nodes.Return {
		for _, b := range n.Bitmaps {
			out = append(out, b.Name)
		}
	}
	return out
}

// TestBackups: a full backup and incrementals of a guest writing
// distinct patterns (and writing during a copy); each point restores to
// the guest's data then; an incremental file holds what changed; a
// restart keeps the chain incremental, a killed QEMU makes the next point
// full (inconsistent bitmap); bad targets fail cleanly.
func TestBackups(t *testing.T) {
	ctx := supervisortest.Context(t, 8*time.Minute)
	sup := supervisortest.New(t, env, "", vmsupBin)
	const name = "bkvm"
	f, _ := backupVM(t, ctx, sup, name)
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "backups")
	take := func(incremental bool, wantMode string) supervisor.BackupResult {
		t.Helper()
		r, err := sup.Backup(ctx, name, supervisor.BackupOptions{Dir: dir, Incremental: incremental})
		if err != nil {
			t.Fatal(err)
		}
		d := r.Disks[0]
		t.Logf("point %d: %s, %d bytes copied, file %s (%d bytes allocated) in %s; reason %q",
			r.Point, d.Mode, d.Copied, d.File, allocated(t, filepath.Join(dir, d.File)), r.Duration, d.Reason)
		if d.Mode != wantMode {
			t.Fatalf("point %d is %s (%s), want %s", r.Point, d.Mode, d.Reason, wantMode)
		}
		if l := leftovers(t, ctx, sup, name); l != "" {
			t.Fatalf("point %d left %s", r.Point, l)
		}
		return r
	}

	// Bad input first: nothing to build on.
	if _, err := sup.Backup(ctx, name, supervisor.BackupOptions{Dir: dir, Incremental: true}); err == nil || !strings.Contains(err.Error(), "no full backup") {
		t.Fatalf("--incremental into an empty directory: %v", err)
	}
	sh := supervisortest.Shell(t, ctx, st)
	guestWrite(t, ctx, sh, "AAAA", 0)
	guestWrite(t, ctx, sh, "ZZZZ", 16) // more data for the full copy
	waitAgent(t, ctx, sup, name)
	agent := filepath.Join(sup.Root(), "vms", name, "qga.sock")
	// The point is taken with the guest's filesystems frozen by its agent
	// (issue 48: backups were crash-consistent only), thawed after.
	if p1 := take(false, backupchain.Full); !strings.HasPrefix(p1.Quiesced, "fsfreeze") {
		t.Errorf("point 1 was not quiesced: %q", p1.Quiesced)
	}
	if fs := freezeStatus(t, ctx, agent); fs != "thawed" {
		t.Fatalf("after point 1 the guest is %s", fs)
	}

	guestWrite(t, ctx, sh, "BBBB", 2)
	// The guest keeps writing during the copy (elsewhere), not paused.
	if _, _, err := sh.Run(ctx, "(while :; do yes WWWW | head -c 65536 | dd of=/dev/vda bs=65536 seek=800 conv=notrunc 2>/dev/null; done) & echo $! > /tmp/w"); err != nil {
		t.Fatal(err)
	}
	p2 := take(true, backupchain.Incremental)
	if _, _, err := sh.Run(ctx, "kill $(cat /tmp/w); sync"); err != nil {
		t.Fatal(err)
	}
	if a := allocated(t, filepath.Join(dir, p2.Disks[0].File)); a > 4*mib {
		t.Errorf("the incremental point 2 takes %d bytes for ~1 MiB changed", a)
	}

	guestWrite(t, ctx, sh, "CCCC", 4)
	sh.Close()
	// A restart: the bitmap is saved in the image and loaded again.
	if _, err := sup.Down(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	take(true, backupchain.Incremental)

	img := restoreRaw(t, ctx, sup, dir, 1)
	expect(t, img, 1, 0, "AAAA")
	expect(t, img, 1, 2, "")
	expect(t, img, 1, 16, "ZZZZ")
	img = restoreRaw(t, ctx, sup, dir, 2)
	expect(t, img, 2, 2, "BBBB")
	expect(t, img, 2, 4, "")
	img = restoreRaw(t, ctx, sup, dir, 3)
	expect(t, img, 3, 0, "AAAA")
	expect(t, img, 3, 2, "BBBB")
	expect(t, img, 3, 4, "CCCC")
	if _, err := sup.Restore(ctx, supervisor.RestoreOptions{Dir: dir, To: filepath.Join(dir, backupchain.ManifestName)}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("restore over an existing file: %v", err)
	}

	// A host crash: QEMU killed while it has the bitmap loaded from the
	// image (so after a restart: a bitmap made in this run is only written
	// into the image when QEMU closes it, and would be missing instead).
	if _, err := sup.Down(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.DownWith(ctx, name, supervisor.DownOptions{Kill: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	r := take(true, backupchain.Full)
	if !strings.Contains(r.Disks[0].Reason, "inconsistent") {
		t.Fatalf("full after a killed QEMU says %q", r.Disks[0].Reason)
	}
	take(true, backupchain.Incremental)
	if bm := bitmapNames(t, ctx, sup, name); len(bm) != 1 {
		t.Errorf("bitmaps after point 5: %v, want only its own", bm)
	}

	// Another VM's directory.
	other := t.TempDir()
	if err := backupchain.New("othervm", "").Save(other); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Backup(ctx, name, supervisor.BackupOptions{Dir: other}); err == nil || !strings.Contains(err.Error(), `"othervm"`) {
		t.Fatalf("backup into another VM's directory: %v", err)
	}
	// A directory too small: 4 MiB of tmpfs for ~3 MiB of data plus metadata.
	small := smallTmpfs(t, "4m")
	st, _ = sup.Status(ctx, name)
	sh = supervisortest.Shell(t, ctx, st)
	for i := 20; i < 26; i++ {
		guestWrite(t, ctx, sh, "FILL", i)
	}
	sh.Close()
	_, err = sup.Backup(ctx, name, supervisor.BackupOptions{Dir: small})
	t.Logf("into a 4 MiB tmpfs: %v", err)
	if err == nil || !strings.Contains(err.Error(), "not enough space") || !strings.Contains(err.Error(), small) {
		t.Fatalf("backup into a full directory: %v", err)
	}
	if left, _ := os.ReadDir(small); len(left) > 0 {
		t.Errorf("files left in the full directory: %v", left)
	}
	if l := leftovers(t, ctx, sup, name); l != "" {
		t.Fatalf("the failed backup left %s", l)
	}
	if fs := freezeStatus(t, ctx, agent); fs != "thawed" {
		t.Fatalf("after the failed backup the guest is %s", fs)
	}
	if st, err := sup.Status(ctx, name); err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("the guest is %s (%v)", st.State, err)
	}
	take(true, backupchain.Incremental) // the chain's bitmap survived the failure
}

// smallTmpfs mounts a tmpfs of size under a temporary directory.
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	d := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", d).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", d).Run() })
	return d
}

// TestBackupKilled: vmsup killed after each step of an incremental
// backup: the guest keeps running, the next command leaves no job, node,
// fd set or file of the point (unless the manifest had it), and the next
// backup is still incremental.
func TestBackupKilled(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	root := t.TempDir()
	sup := supervisortest.New(t, env, root, vmsupBin)
	const name = "bkkill"
	backupVM(t, ctx, sup, name)
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	sh := supervisortest.Shell(t, ctx, st)
	dir := filepath.Join(t.TempDir(), "backups")
	guestWrite(t, ctx, sh, "AAAA", 0)
	if _, err := sup.Backup(ctx, name, supervisor.BackupOptions{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		step     string
		recorded bool
	}{{"files", false}, {"nodes", false}, {"start", false}, {"copy", false}, {"detach", false}, {"manifest", true}} {
		guestWrite(t, ctx, sh, "KILL", 2+i)
		before, _ := backupchain.Load(dir)
		cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", root, env.Systemd.BusAddress, vmsupBin, name, dir, "backup-incremental", c.step)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("the helper was not killed after %s: %v\n%s", c.step, err, out)
		}
		// The next command recovers (under the VM's lock).
		if err := sup.Pause(ctx, name); err != nil {
			t.Fatalf("after a kill after %s: next command: %v", c.step, err)
		}
		if err := sup.Resume(ctx, name); err != nil {
			t.Fatal(err)
		}
		if l := leftovers(t, ctx, sup, name); l != "" {
			t.Fatalf("killed after %s: left %s", c.step, l)
		}
		after, _ := backupchain.Load(dir)
		if got := len(after.Points) > len(before.Points); got != c.recorded {
			t.Fatalf("killed after %s: recorded %v, want %v", c.step, got, c.recorded)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.qcow2"))
		if len(files) != len(after.Points) {
			t.Fatalf("killed after %s: files %v for %d points", c.step, files, len(after.Points))
		}
		r, err := sup.Backup(ctx, name, supervisor.BackupOptions{Dir: dir, Incremental: true})
		if err != nil {
			t.Fatal(err)
		}
		if r.Disks[0].Mode != backupchain.Incremental {
			t.Fatalf("killed after %s: the next point is %s (%s)", c.step, r.Disks[0].Mode, r.Disks[0].Reason)
		}
		if bm := bitmapNames(t, ctx, sup, name); len(bm) != 1 {
			t.Fatalf("killed after %s: bitmaps %v", c.step, bm)
		}
		t.Logf("killed after %s: recorded=%v; next point %d incremental, %d bytes copied", c.step, c.recorded, r.Point, r.Disks[0].Copied)
	}
	sh.Close()
	last, _ := backupchain.Load(dir)
	img := restoreRaw(t, ctx, sup, dir, last.Points[len(last.Points)-1].N)
	expect(t, img, 0, 0, "AAAA")
	for i := range 6 {
		expect(t, img, 0, 2+i, "KILL")
	}
	if st, err := sup.Status(ctx, name); err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("the guest is %s (%v)", st.State, err)
	}
}
