package storage

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDataBytes: what an image holds itself, not its virtual size, its
// zeroed extents or its backing file's data.
func TestDataBytes(t *testing.T) {
	tools := needQemuImg(t)
	if _, err := exec.LookPath("qemu-io"); err != nil {
		t.Skip("qemu-io is not installed (apt-get install qemu-utils)")
	}
	dir := t.TempDir()
	base, top := filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "top.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", base, "64M")
	qemuIO(t, base, "write -P 0xab 0 450k", "write -z 1M 1M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top)
	qemuIO(t, top, "write -P 0xcd 2M 64k")
	for _, c := range []struct {
		path string
		want int64
	}{{base, 512 << 10}, {top, 64 << 10}} {
		if n, err := tools.DataBytes(context.Background(), c.path, "qcow2"); err != nil || n != c.want {
			t.Errorf("DataBytes(%s) = %d, %v; want %d", filepath.Base(c.path), n, err, c.want)
		}
	}
}

func qemuIO(t *testing.T, path string, cmds ...string) {
	t.Helper()
	args := []string{"-f", "qcow2"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	if out, err := exec.Command("qemu-io", append(args, path)...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io %v: %v\n%s", cmds, err, out)
	}
}
