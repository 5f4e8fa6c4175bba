package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTGT: a LUN with and one without CHAP answer qemu-img through QEMU's
// iSCSI driver, a wrong password is refused, and Stop ends tgtd.
func TestTGT(t *testing.T) {
	SkipUnlessRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	tg, err := StartTGT(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	lun := filepath.Join(dir, "lun")
	if err := MakeFile(lun, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddTarget(ctx, 1, "iqn.2026-01.test:open", lun, "", ""); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddTarget(ctx, 2, "iqn.2026-01.test:chap", lun, "u", "pw-123456789"); err != nil {
		t.Fatal(err)
	}
	info := func(target, secret string) (string, error) {
		args := []string{"info"}
		opts := "driver=raw,file.driver=iscsi,file.transport=tcp,file.portal=" + tg.Portal + ",file.target=" + target + ",file.lun=1"
		if secret != "" {
			args = append(args, "--object", "secret,id=s,data="+secret)
			opts += ",file.user=u,file.password-secret=s"
		}
		out, err := exec.CommandContext(ctx, "qemu-img", append(args, "--image-opts", opts)...).CombinedOutput()
		return string(out), err
	}
	if out, err := info("iqn.2026-01.test:open", ""); err != nil || !strings.Contains(out, "8 MiB") {
		t.Errorf("open LUN: %v %s", err, out)
	}
	if out, err := info("iqn.2026-01.test:chap", "pw-123456789"); err != nil || !strings.Contains(out, "8 MiB") {
		t.Errorf("CHAP LUN: %v %s", err, out)
	}
	if out, err := info("iqn.2026-01.test:chap", "wrong"); err == nil || !strings.Contains(out, "Authentication failure") {
		t.Errorf("wrong CHAP password: %v %s", err, out)
	}
	pid := tg.cmd.Process.Pid
	if err := tg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("tgtd %d still runs after Stop", pid)
	}
}

// TestCeph: the single-node cluster serves an RBD image that qemu-img opens
// with the admin's cephx key and a conf without keyring; Stop ends the
// daemons.
func TestCeph(t *testing.T) {
	SkipUnlessRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "testenv-ceph-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	t0 := time.Now()
	c, err := StartCeph(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if _, err := c.RBD(ctx, "create", c.Pool+"/img", "--size", "8M"); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster with an RBD image in %s", time.Since(t0))
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte(c.AdminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--object", "secret,id=k,format=base64,file="+key,
		"--image-opts", "driver=raw,file.driver=rbd,file.pool="+c.Pool+",file.image=img,file.conf="+c.ClientConf+
			",file.user=admin,file.key-secret=k").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "8 MiB") {
		t.Errorf("qemu-img info rbd: %v %s", err, out)
	}
	var pids []int
	for _, p := range c.procs {
		pids = append(pids, p.Process.Pid)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("ceph daemon %d still runs after Stop", pid)
		}
	}
}
