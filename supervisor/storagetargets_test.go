package supervisor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// targets are the real iSCSI target and Ceph cluster the storage tests
// share, started on first use and stopped by TestMain.
var targets supervisortest.Targets

// chapUser and chapPassword are the CHAP account of every CHAP target.
const (
	chapUser     = "vmsup-test"
	chapPassword = "Chap-Secret-7x9q2" // must never show up in argv, ps or state files
)

func needTGT(t *testing.T) *testenv.TGT   { return targets.NeedTGT(t) }
func needCeph(t *testing.T) *testenv.Ceph { return targets.NeedCeph(t) }

// newLUN creates a file-backed LUN of size bytes on the shared tgtd, behind
// CHAP if chap, and returns its IQN and backing file.
func newLUN(t *testing.T, name string, size int64, chap bool) (iqn, file string) {
	t.Helper()
	tg := needTGT(t)
	tid := targets.NextTID()
	iqn = fmt.Sprintf("iqn.2026-01.test.vmsup:%s", name)
	file = filepath.Join(targets.Dir, "tgt", name+".lun")
	if err := testenv.MakeFile(file, size); err != nil {
		t.Fatal(err)
	}
	user, pass := "", ""
	if chap {
		user, pass = chapUser, chapPassword
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tg.AddTarget(ctx, tid, iqn, file, user, pass); err != nil {
		t.Fatal(err)
	}
	return iqn, file
}

// newRBD creates an RBD image of size in the shared cluster's pool.
func newRBD(t *testing.T, name, size string) {
	t.Helper()
	c := needCeph(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := c.RBD(ctx, "create", c.Pool+"/"+name, "--size", size); err != nil {
		t.Fatalf("rbd create: %v %s", err, out)
	}
}

// loopDevice attaches a new file of size bytes to a loop device and
// detaches it at the end of the test.
func loopDevice(t *testing.T, size int64) (dev, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "loop.img")
	if err := testenv.MakeFile(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup (loop devices are needed for the raw block test): %v %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v %s", dev, err, out)
		}
	})
	return dev, file
}

// readAt reads n bytes at off from a file on the host.
func readAt(t *testing.T, path string, off int64, n int) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s at %d: %v", path, off, err)
	}
	return string(b)
}
