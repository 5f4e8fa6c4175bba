package supervisor_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStorageBadInput: each broken disk fails up with one line naming the
// file, the disk's key and the disk, before anything is started: no unit, no
// state directory, no image created.
func TestStorageBadInput(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	dir := t.TempDir()
	sup := newSup(t, "")

	base := filepath.Join(dir, "base.qcow2")
	qemuImgT(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "32M")
	gone := filepath.Join(dir, "gone.qcow2")
	qemuImgT(t, "qemu-img", "create", "-q", "-f", "qcow2", gone, "32M")
	orphan := filepath.Join(dir, "orphan.qcow2")
	qemuImgT(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", gone, "-F", "qcow2", orphan)
	os.Remove(gone)
	newImage := filepath.Join(dir, "new.qcow2")

	chapIQN, _ := newLUN(t, "bad-chap", 8<<20, true)
	wrongPW := filepath.Join(dir, "wrong.secret")
	if err := os.WriteFile(wrongPW, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ceph := needCeph(t)
	newRBD(t, "bad-exists", "8M")
	cephKey := filepath.Join(dir, "ceph.key")
	if err := os.WriteFile(cephKey, []byte(ceph.AdminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	closed := closedPort(t)
	rbd := func(pool, image string) string {
		return fmt.Sprintf("type = \"rbd\"\npool = %q\nimage = %q\nceph_conf = %q\nuser = \"admin\"\nsecret_file = %q\n",
			pool, image, ceph.ClientConf, cephKey)
	}

	for _, c := range []struct{ name, disk, want string }{
		{"missing base", fmt.Sprintf("file = %q\nbacking = %q\n", newImage, filepath.Join(dir, "nobase.qcow2")),
			`disk[0].backing: disk "d": base image ` + dir + `/nobase.qcow2: no such file`},
		{"missing backing file in chain", fmt.Sprintf("file = %q\n", orphan),
			`disk "d": ` + orphan + `'s base image ` + gone + `: no such file`},
		{"size smaller than base", fmt.Sprintf("file = %q\nbacking = %q\nsize = \"16M\"\n", newImage, base),
			`disk[0].size: disk "d": size 16M is smaller than its base image ` + base + ` (32M): an overlay cannot shrink its base`},
		{"unreachable portal", fmt.Sprintf("type = \"iscsi\"\nportal = \"127.0.0.1:%d\"\ntarget = %q\nlun = 1\n", closed, chapIQN),
			fmt.Sprintf(`disk[0].portal: disk "d": iSCSI portal 127.0.0.1:%d unreachable: connect: connection refused`, closed)},
		{"wrong CHAP password", fmt.Sprintf("type = \"iscsi\"\nportal = %q\ntarget = %q\nlun = 1\nuser = %q\nsecret_file = %q\n",
			targets.TGT.Portal, chapIQN, chapUser, wrongPW),
			fmt.Sprintf(`disk[0]: disk "d": iSCSI %s LUN 1 at %s: iSCSI: Failed to connect to LUN : Failed to log in to target. Status: Authentication failure`, chapIQN, targets.TGT.Portal)},
		{"missing RBD image", rbd(ceph.Pool, "nosuch"),
			`disk[0]: disk "d": rbd pool "rbd" image "nosuch": error reading header from nosuch: No such file or directory`},
		{"missing RBD pool", rbd("nopool", "bad-exists"),
			`disk[0]: disk "d": rbd pool "nopool" image "bad-exists": error opening pool nopool: No such file or directory`},
		{"not a block device", fmt.Sprintf("type = \"block\"\nfile = %q\n", base),
			`disk[0].file: disk "d": ` + base + ` is not a block device`},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := "bad-" + strings.ReplaceAll(c.name, " ", "-")
			f := guestFile(t, t.TempDir(), name, "[[disk]]\nname = \"d\"\n"+c.disk)
			t0 := time.Now()
			_, err := sup.Up(ctx, f)
			if err == nil {
				sup.Down(ctx, name)
				t.Fatalf("up succeeded, want an error containing %q", c.want)
			}
			t.Logf("%s (after %s)", err, time.Since(t0).Round(time.Millisecond))
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") ||
				!strings.HasPrefix(err.Error(), f.Path+":") {
				t.Errorf("error\n%q\nwant one line starting with %s: and containing\n%q", err, f.Path, c.want)
			}
			assertNothingStarted(t, ctx, sup, name)
			if _, err := os.Stat(newImage); !os.IsNotExist(err) {
				t.Errorf("an image was created: %v", err)
				os.Remove(newImage)
			}
		})
	}
}

// closedPort returns a loopback TCP port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return p
}
