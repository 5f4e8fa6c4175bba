package devicetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestHostDevHotplug: this host has no IOMMU, so the device is a fake one
// (a sysfs tree with a device already on vfio-pci in IOMMU group 42, and
// /dev/vfio nodes of the test's own); QEMU and its sandboxed unit are real.
// An attach gives QEMU's running unit the group's node (seen in its mount
// namespace after the step), then QEMU refuses the device (it finds no such
// device in the real sysfs): every step is undone (the node is gone from
// QEMU's /dev, nothing recorded or journaled) and the guest keeps running.
// An address not on the host and a detach of what was never attached are
// refused by name.
func TestHostDevHotplug(t *testing.T) {
	const addr = "0000:01:00.0"
	ctx := supervisortest.Context(t, 3*time.Minute)
	sysRoot := fakeSysfs(t, addr, "42")
	devRoot, err := os.MkdirTemp("/dev", "vmsup-test-") // DeviceAllow= takes only /dev paths
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(devRoot)
	group := filepath.Join(devRoot, "vfio", "42")
	for i, n := range []string{filepath.Join(devRoot, "vfio", "vfio"), group} {
		if err := os.MkdirAll(filepath.Dir(n), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mknod(n, syscall.S_IFCHR|0o600, int(unix.Mkdev(10, uint32(229+i)))); err != nil {
			t.Skipf("mknod %s: %v", n, err)
		}
	}
	seen := map[string]bool{} // the group node in QEMU's /dev, after each step
	root := t.TempDir()
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU,
		HostCaps: env.Caps, JournalDir: env.Systemd.JournalDir, Self: vmsupBin, SysRoot: sysRoot, DevRoot: devRoot,
		AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs,
		AfterStep: func(vm, step string) {
			if pids, err := env.Systemd.HostPIDs("vmsup-hdvm.service"); err == nil && len(pids) > 0 {
				seen[step] = exec.Command("nsenter", "-t", strconv.Itoa(pids[0]), "-m", "test", "-c", group).Run() == nil
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "hdvm.toml")
	supervisortest.WriteGuestTOML(t, env, path, "hdvm", "stop_timeout = \"2s\"\n") // the guest need not boot
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(context.Background(), "hdvm")

	err = sup.AttachHostDev(ctx, "hdvm", spec.HostDev{Address: addr})
	if err == nil || !strings.Contains(err.Error(), "device_add") {
		t.Fatalf("attach of a device QEMU cannot open: %v", err)
	}
	t.Logf("QEMU refused it: %v", err)
	if !seen["nodes"] {
		t.Errorf("the group node %s was not in QEMU's /dev after the nodes step (steps seen: %v)", group, seen)
	}
	pids, _ := env.Systemd.HostPIDs("vmsup-hdvm.service")
	if len(pids) == 0 || exec.Command("nsenter", "-t", strconv.Itoa(pids[0]), "-m", "test", "-e", group).Run() == nil {
		t.Errorf("after the undo: QEMU %v, its /dev still has %s", pids, group)
	}
	st := status(t, ctx, sup, "hdvm")
	if st.State != supervisor.StateRunning || st.Recovery != "" || len(st.HostDevs) != 0 {
		t.Errorf("after the failed attach: %s, recovery %q, host devices %+v", st.State, st.Recovery, st.HostDevs)
	}
	if _, err := os.Stat(filepath.Join(root, "records", "hdvm", "hostdev.json")); err == nil {
		t.Error("the drivers record was kept for a device not attached")
	}

	// vmsup killed after the node reached QEMU (and after the bind): the
	// next command on the VM undoes the attach.
	for _, step := range []string{"bind", "nodes"} {
		cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", root, env.Systemd.BusAddress, vmsupBin, path, step,
			"hostdev", sysRoot, devRoot, addr)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("helper did not die after %s: %v\n%s", step, err, out)
		}
		st := status(t, ctx, sup, "hdvm") // recovers: nobody holds the VM's lock
		if st.State != supervisor.StateRunning || !strings.Contains(st.Recovery, "had not reached the guest") {
			t.Errorf("killed after %s: %s, recovery %q", step, st.State, st.Recovery)
		}
		if exec.Command("nsenter", "-t", strconv.Itoa(pids[0]), "-m", "test", "-e", group).Run() == nil {
			t.Errorf("killed after %s: QEMU's /dev still has %s after recovery", step, group)
		}
		if _, err := os.Stat(filepath.Join(root, "records", "hdvm", "hostdev.json")); err == nil {
			t.Errorf("killed after %s: the drivers record was kept", step)
		}
	}

	for _, c := range []struct {
		do   func() error
		want string
	}{
		{func() error { return sup.AttachHostDev(ctx, "hdvm", spec.HostDev{Address: "09:00.0"}) }, "no such PCI device"},
		{func() error { return sup.DetachHostDev(ctx, "hdvm", addr) }, "no such hot-plugged host device"},
	} {
		if err := c.do(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

// fakeSysfs is a sysfs tree with one PCI device at addr, alone in IOMMU
// group group and already on vfio-pci (so binding it writes nothing).
func fakeSysfs(t *testing.T, addr, group string) string {
	root := t.TempDir()
	dev := filepath.Join(root, "bus/pci/devices", addr)
	for _, d := range []string{dev, filepath.Join(root, "bus/pci/drivers/vfio-pci"), filepath.Join(root, "kernel/iommu_groups", group, "devices")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{dev + "/class": "0x020000\n", dev + "/driver_override": "vfio-pci\n",
		root + "/bus/pci/drivers_probe": "", root + "/bus/pci/drivers/vfio-pci/bind": "", root + "/bus/pci/drivers/vfio-pci/unbind": ""}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{dev + "/driver": root + "/bus/pci/drivers/vfio-pci",
		dev + "/iommu_group": root + "/kernel/iommu_groups/" + group, root + "/kernel/iommu_groups/" + group + "/devices/" + addr: dev}
	for l, target := range links {
		if err := os.Symlink(target, l); err != nil {
			t.Fatal(fmt.Errorf("link %s: %w", l, err))
		}
	}
	return root
}
