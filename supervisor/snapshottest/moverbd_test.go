package snapshottest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestDiskMoveRBD: a running guest's disk moves from a file to an RBD
// image of the package's Ceph and back to a file; the guest reads its data
// after each pivot, and boots from the last image.
func TestDiskMoveRBD(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	c := shared.NeedCeph(t)
	dir := t.TempDir()
	if out, err := c.RBD(ctx, "create", "--size", "16", c.Pool+"/moverbd"); err != nil {
		t.Fatalf("rbd create: %v %s", err, out)
	}
	key := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(key, []byte(c.AdminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`name = "mvrbd"
memory = "128M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "16M"

# QEMU reaches Ceph only in the host's network: a NIC puts its unit there.
[[nic]]
name = "net0"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, filepath.Join(dir, "data.raw"), env.Guest.Kernel, env.Guest.Initrd)
	sup, f, st := upVM(t, ctx, "", dir, "mvrbd", body)
	sh := supervisortest.Shell(t, ctx, st)
	run := func(cmd string) string {
		t.Helper()
		out, _, err := sh.Run(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	read := func() string { return run("echo 3 > /proc/sys/vm/drop_caches; head -c 8 /dev/vda; echo") }
	run("printf RBDMOVE1 > /dev/vda && sync")
	// The running QEMU sees new files only in the image directories (its
	// unit's mount namespace was fixed at start): the client's ceph.conf
	// goes there (a host's /etc/ceph is visible anyway).
	conf := filepath.Join(sup.Root(), "images", "ceph.conf")
	b, err := os.ReadFile(c.ClientConf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("name = \"data\"\ntype = \"rbd\"\npool = %q\nimage = \"moverbd\"\nceph_conf = %q\nuser = \"admin\"\nsecret_file = %q\n",
		c.Pool, conf, key)
	rbd, err := spec.ParseDisk(filepath.Join(dir, "rbd.toml"), []byte(target), "mvrbd") // as `disk move --spec` reads it
	if err != nil {
		t.Fatal(err)
	}
	r, err := sup.MoveDisk(ctx, "mvrbd", "data", supervisor.MoveOptions{Spec: rbd})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("file -> rbd: %+v", r)
	if got := read(); !strings.Contains(got, "RBDMOVE1") {
		t.Fatalf("on the RBD image the guest reads %q", got)
	}
	run("printf RBDMOVE2 > /dev/vda && sync")
	back := filepath.Join(sup.Root(), "images", "back.qcow2")
	if r, err = sup.MoveDisk(ctx, "mvrbd", "data", supervisor.MoveOptions{To: back}); err != nil {
		t.Fatal(err)
	}
	t.Logf("rbd -> file: %+v", r)
	if got := read(); !strings.Contains(got, "RBDMOVE2") {
		t.Fatalf("back on a file the guest reads %q", got)
	}
	sh.Close()
	if _, err := sup.Down(ctx, "mvrbd"); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	st, _ = sup.Status(ctx, "mvrbd")
	sh = supervisortest.Shell(t, ctx, st)
	if got := read(); !strings.Contains(got, "RBDMOVE2") {
		t.Fatalf("booted again, the guest reads %q (moved: %v)", got, st.MovedDisks)
	}
}
