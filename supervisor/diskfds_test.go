package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestStorageByDescriptor boots a guest with a qcow2 overlay on a base, a
// raw disk and an ISO, all outside its state directory, and shows that
// QEMU got them as descriptors (issue 45): neither its command line nor
// any block node names a path outside the state directory, the guest
// reads each disk's data, no ACL entry is given on any image (running,
// after down, kill, and an up killed right after the disks step), and a
// name swapped for a symlink to a root-only file before that step gives
// QEMU nothing.
func TestStorageByDescriptor(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	root, dir := t.TempDir(), t.TempDir()
	sup := newSup(t, root)

	base := filepath.Join(dir, "base.qcow2")
	qemuImgT(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "32M")
	qemuImgT(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 2M 4k", base)
	raw := filepath.Join(dir, "raw.img")
	qemuImgT(t, "qemu-img", "create", "-q", "-f", "raw", raw, "16M")
	rawPattern := randPattern("raw")
	if err := os.WriteFile(raw+".pat", []byte(rawPattern), 0o600); err != nil {
		t.Fatal(err)
	}
	qemuImgT(t, "dd", "if="+raw+".pat", "of="+raw, fmt.Sprintf("seek=%d", patternOff), "oflag=seek_bytes", "conv=notrunc", "status=none")
	isoPattern := randPattern("iso")
	iso := filepath.Join(dir, "data.iso")
	if err := storage.BuildISO(iso, "VMSUPDATA", map[string][]byte{"pattern.txt": []byte(isoPattern)}); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "vm.qcow2")
	f := guestFile(t, dir, "fds", fmt.Sprintf(`
[[disk]]
name = "root"
file = %q
backing = %q
size = "32M"
serial = "root"

[[disk]]
name = "raw"
file = %q
format = "raw"
serial = "raw"

[[disk]]
name = "iso"
type = "iso"
file = %q
`, overlay, base, raw, iso))
	images := []string{base, overlay, raw, iso}

	t0 := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Logf("up with 3 disks by descriptor in %s", time.Since(t0))
	st, err := sup.Status(ctx, "fds")
	if err != nil {
		t.Fatal(err)
	}
	checkNoHostPaths(t, ctx, sup, st)
	supervisortest.NoACLs(t, "running", images)

	g := bootGuest(t, ctx, st)
	if got := g.run(fmt.Sprintf("dd if=%s bs=4096 skip=512 count=1 2>/dev/null | head -c 4", g.devOf("root"))); got != "ZZZZ" {
		t.Errorf("overlay does not show its base's data at 2 MiB: %q", got)
	}
	if got := g.read(g.devOf("raw"), len(rawPattern)); got != rawPattern {
		t.Errorf("raw disk reads %q, want %q", got, rawPattern)
	}
	written := randPattern("root")
	g.write(g.devOf("root"), written)
	if cds := g.cdroms(1); !strings.Contains(cds, "pattern.txt: "+isoPattern) {
		t.Errorf("guest CD-ROM:\n%s", cds)
	}

	if _, err := sup.Down(ctx, "fds"); err != nil {
		t.Fatal(err)
	}
	supervisortest.NoACLs(t, "after down", images)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Kill(ctx, "fds"); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, sup, "fds", supervisor.StateShutOff, time.Minute)
	supervisortest.NoACLs(t, "after kill", images)

	t.Run("killed-after-disks", func(t *testing.T) { killedAfterDisks(t, ctx, sup, root, f, images, written) })
	t.Run("swap-to-symlink", func(t *testing.T) { swapToSymlink(t, ctx, root, f, raw, images) })
	t.Run("hotplug", func(t *testing.T) { hotplugByDescriptor(t, ctx, sup, f, base) })
}

// hotplugByDescriptor: disk attach passes a qcow2 disk on a base as
// descriptors too (no grant, no node on a host path), and detach removes
// every node and fd set of its chain.
func hotplugByDescriptor(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, f *spec.File, base string) {
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(ctx, "fds")
	st := waitState(t, ctx, sup, "fds", supervisor.StateRunning, time.Minute)
	g := bootGuest(t, ctx, st)
	hot := filepath.Join(sup.Root(), "images", "hot.qcow2")
	qemuImgT(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", hot)
	d, err := spec.CheckDisk("test", spec.Disk{Name: "hot", File: hot, Serial: "hot"}, "fds")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sup.AttachDisk(ctx, "fds", *d); err != nil {
		t.Fatal(err)
	}
	if got := g.run(fmt.Sprintf("dd if=%s bs=4096 skip=512 count=1 2>/dev/null | head -c 4", g.devOf("hot"))); got != "ZZZZ" {
		t.Errorf("hot-plugged overlay does not show its base's data: %q", got)
	}
	checkNoHostPaths(t, ctx, sup, st)
	supervisortest.NoACLs(t, "attached", []string{hot, base})
	if err := sup.DetachDisk(ctx, "fds", "hot"); err != nil {
		t.Fatal(err)
	}
	reply, err := sup.QMP(ctx, "fds", []byte(`{"execute":"query-fdsets"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(reply), "disk hot") {
		t.Errorf("fd sets of the detached disk remain: %s", reply)
	}
	nodes, err := sup.QMP(ctx, "fds", []byte(`{"execute":"query-named-block-nodes"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(nodes), "hot\"") {
		t.Errorf("nodes of the detached disk remain: %s", nodes)
	}
}

// killedAfterDisks: an up killed right after the disks step leaves a
// QEMU that never ran the guest; status says starting, no image has an
// ACL entry, and the next up stops it and starts the VM afresh; down
// stops one at once.
func killedAfterDisks(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, root string, f *spec.File, images []string, written string) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", root, env.Systemd.BusAddress, vmsupBin, f.Path, supervisor.StepDisks)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die after %s: %v\n%s", supervisor.StepDisks, err, out)
	}
	if st, err := sup.Status(ctx, "fds"); err != nil || st.State != supervisor.StateStarting {
		t.Errorf("status of a QEMU left paused before its guest ran: %+v %v (want starting)", st, err)
	}
	supervisortest.NoACLs(t, "after an up killed after the disks step", images)
	res, err := sup.Up(ctx, f)
	if err != nil {
		t.Fatalf("up after a start killed after the disks step: %v", err)
	}
	t.Logf("next up: %s (%s)", res[0].Action, res[0].Note)
	st := waitState(t, ctx, sup, "fds", supervisor.StateRunning, time.Minute)
	if n := len(qemuPIDs(t, "fds")); n != 1 {
		t.Fatalf("%d QEMU processes after up", n)
	}
	g := bootGuest(t, ctx, st)
	if got := g.read(g.devOf("root"), len(written)); got != written {
		t.Errorf("root reads %q after the settled start, want %q", got, written)
	}
	if _, err := sup.Down(ctx, "fds"); err != nil {
		t.Fatal(err)
	}
	supervisortest.NoACLs(t, "after the settled start's down", images)
	// Down settles one too, at once (its guest never ran: no powerdown).
	cmd = exec.CommandContext(ctx, os.Args[0], "-crash-helper", root, env.Systemd.BusAddress, vmsupBin, f.Path, supervisor.StepDisks)
	if out, err := cmd.CombinedOutput(); !errors.As(err, &ee) {
		t.Fatalf("helper did not die after %s: %v\n%s", supervisor.StepDisks, err, out)
	}
	down, err := sup.Down(ctx, "fds")
	if err != nil || down.Step != supervisor.StoppedQuit {
		t.Fatalf("down of a QEMU whose start died before its guest ran: %+v %v (want quit)", down, err)
	}
	if n := len(qemuPIDs(t, "fds")); n != 0 {
		t.Fatalf("%d QEMU processes after down", n)
	}
	supervisortest.NoACLs(t, "after down of a start killed after the disks step", images)
}

// swapToSymlink: the raw disk's name becomes a symlink to a root-only file
// between the storage checks and the disks step; the start is refused
// naming the disk, and QEMU gets nothing.
func swapToSymlink(t *testing.T, ctx context.Context, root string, f *spec.File, raw string, images []string) {
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("VMSUP-SECRET-DATA"), 0o600); err != nil {
		t.Fatal(err)
	}
	moved := raw + ".moved"
	// Between validate (and the storage step's checks) and the disks
	// step, the raw disk's name becomes a symlink to the secret.
	swapSup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU,
		HostCaps: env.Caps, JournalDir: env.Systemd.JournalDir, Self: vmsupBin, AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs,
		AfterStep: func(_, step string) {
			if step == supervisor.StepUnit {
				if err := os.Rename(raw, moved); err == nil {
					os.Symlink(secret, raw)
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer swapSup.Close()
	defer func() { os.Remove(raw); os.Rename(moved, raw) }()
	_, err = swapSup.Up(ctx, f)
	if err == nil || !strings.Contains(err.Error(), "raw") || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("up with the raw disk swapped for a symlink: %v (want a refusal naming the disk and the symlink)", err)
	}
	t.Logf("refused: %v", err)
	if n := len(qemuPIDs(t, "fds")); n != 0 {
		t.Errorf("%d QEMU processes left after the refused start", n)
	}
	supervisortest.NoACLs(t, "after the refused start", append(images, secret))
}

// checkNoHostPaths: QEMU's command line and its block nodes name no disk
// path outside the VM's state directory (only /dev/fdset/N).
func checkNoHostPaths(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, st supervisor.Status) {
	t.Helper()
	pids := qemuPIDs(t, st.Name) // the host's PIDs (MainPID is systemd's, in the sandbox)
	if len(pids) != 1 {
		t.Fatalf("%d QEMU processes", len(pids))
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cmdline), "qemu-system") {
		t.Fatalf("process %d is not QEMU: %q", pids[0], cmdline)
	}
	argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	for i, a := range argv {
		if i > 0 && argv[i-1] == "-blockdev" && strings.Contains(a, `"filename"`) && !strings.Contains(a, st.StateDir+"/") {
			t.Errorf("QEMU's argv has a block node outside its state directory: %s", a)
		}
	}
	reply, err := sup.QMP(ctx, "fds", []byte(`{"execute":"query-named-block-nodes"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	var nodes struct {
		Return []struct {
			NodeName string `json:"node-name"`
			File     string `json:"file"`
			Drv      string `json:"drv"`
		} `json:"return"`
	}
	if err := json.Unmarshal(reply, &nodes); err != nil {
		t.Fatalf("query-named-block-nodes: %v\n%s", err, reply)
	}
	fdset := regexp.MustCompile(`^(json:.*|/dev/fdset/[0-9]+)$`)
	n := 0
	for _, nd := range nodes.Return {
		if strings.HasPrefix(nd.File, st.StateDir+"/") {
			continue
		}
		if !fdset.MatchString(nd.File) || (strings.HasPrefix(nd.File, "json:") && !strings.Contains(nd.File, "/dev/fdset/")) {
			t.Errorf("block node %s (%s) opens %s", nd.NodeName, nd.Drv, nd.File)
		}
		n++
	}
	if n < 8 { // at least overlay, base, raw, ISO: a file and a format node each
		t.Errorf("%d block nodes on descriptors, want 8:\n%s", n, reply)
	}
}
