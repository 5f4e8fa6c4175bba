package snapshottest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestSnapshotRBD: a VM with a file disk and an RBD disk (the package's
// one-node Ceph on loopback): one snapshot holds both at one moment (an
// overlay for the file, an RBD snapshot for the image, the guest paused
// around them); after more writes a revert brings both back; removing the
// snapshot removes the RBD one.
func TestSnapshotRBD(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	c := shared.NeedCeph(t)
	dir := t.TempDir()
	if out, err := c.RBD(ctx, "create", "--size", "16", c.Pool+"/snaprbd"); err != nil {
		t.Fatalf("rbd create: %v %s", err, out)
	}
	key := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(key, []byte(c.AdminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`name = "rbdvm"
memory = "128M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "16M"

[[disk]]
name = "ceph"
type = "rbd"
pool = %q
image = "snaprbd"
ceph_conf = %q
user = "admin"
secret_file = %q

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, filepath.Join(dir, "data.raw"), c.Pool, c.ClientConf, key, env.Guest.Kernel, env.Guest.Initrd)
	sup, _, st := upVM(t, ctx, "", dir, "rbdvm", body)
	sh := supervisortest.Shell(t, ctx, st)
	run := func(cmd string) string {
		t.Helper()
		out, _, err := sh.Run(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	write := func(p string) { run("printf " + p + "-A > /dev/vda && printf " + p + "-B > /dev/vdb && sync") }
	read := func() string {
		return run("echo 3 > /proc/sys/vm/drop_caches; echo $(head -c 10 /dev/vda) $(head -c 10 /dev/vdb)")
	}
	write("PATTERN1")
	r, err := sup.Snapshot(ctx, "rbdvm", "s1", supervisor.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("s1: %+v", r)
	if out, err := c.RBD(ctx, "snap", "ls", c.Pool+"/snaprbd"); err != nil || !strings.Contains(string(out), "vmsup-s1") {
		t.Fatalf("rbd snap ls: %s %v", out, err)
	}
	write("PATTERN2")
	if got := read(); !strings.Contains(got, "PATTERN2-A PATTERN2-B") {
		t.Fatalf("before the revert the guest reads %q", got)
	}
	if _, err := sup.RevertSnapshot(ctx, "rbdvm", "s1", true); err != nil {
		t.Fatal(err)
	}
	sh = supervisortest.Shell(t, ctx, st)
	if got := read(); !strings.Contains(got, "PATTERN1-A PATTERN1-B") {
		t.Fatalf("after the revert the guest reads %q, want PATTERN1 on both", got)
	}
	if err := sup.RemoveSnapshot(ctx, "rbdvm", "s1", nil); err != nil {
		t.Fatal(err)
	}
	if out, err := c.RBD(ctx, "snap", "ls", c.Pool+"/snaprbd"); err != nil || strings.Contains(string(out), "vmsup-s1") {
		t.Fatalf("rbd snap ls after rm: %s %v", out, err)
	}
	if got := read(); !strings.Contains(got, "PATTERN1-A PATTERN1-B") {
		t.Fatalf("after removing the snapshot the guest reads %q", got)
	}
}
