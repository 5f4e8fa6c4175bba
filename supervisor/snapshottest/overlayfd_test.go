package snapshottest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestOverlaysByDescriptor (issue 45): a qcow2 data disk in the image
// directory goes through a live snapshot, a restart (it boots on the
// overlay), the snapshot's live removal (a commit into its own image), a
// move and a backup. After each, QEMU's argv and block nodes name no file
// outside the VM's state directory (only /dev/fdset/N), the guest reads
// what it wrote, and no image has an ACL entry; systemctl stop still
// powers the guest off by ACPI.
func TestOverlaysByDescriptor(t *testing.T) {
	ctx := supervisortest.Context(t, 6*time.Minute)
	sup := supervisortest.New(t, env, "", vmsupBin)
	images := filepath.Join(sup.Root(), "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	body := fmt.Sprintf(`name = "ovd"
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
`, filepath.Join(images, "ovd-data.qcow2"), env.Guest.Kernel, env.Guest.Initrd)
	f := supervisortest.UpTOML(t, ctx, sup, dir, "ovd", body)
	t.Cleanup(func() { sup.Down(context.Background(), "ovd") })
	words := []string{}
	step := func(what string, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		st, err := sup.Status(ctx, "ovd")
		if err != nil {
			t.Fatal(err)
		}
		sh := supervisortest.Shell(t, ctx, st)
		defer sh.Close()
		for i, w := range words {
			cmd := fmt.Sprintf("echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=65536 skip=%d count=1 2>/dev/null | head -c %d", i*16, len(w))
			if out, _, err := sh.Run(ctx, cmd); err != nil || !strings.Contains(out, w) {
				t.Fatalf("%s: the guest reads %q at %d MiB, want %q (%v)", what, out, i, w, err)
			}
		}
		w := fmt.Sprintf("w%d", len(words))
		guestWrite(t, ctx, sh, w, len(words))
		words = append(words, w)
		onlyDescriptors(t, ctx, sup, st, what, images, dir)
	}
	step("booted", func() error { return nil })
	step("live snapshot", func() error { _, err := sup.Snapshot(ctx, "ovd", "k", supervisor.SnapshotOptions{}); return err })
	step("restarted on the overlay", func() error { _, err := sup.Restart(ctx, f); return err })
	step("live removal", func() error { return sup.RemoveSnapshot(ctx, "ovd", "k", nil) })
	moved := filepath.Join(images, "ovd-moved.qcow2")
	step("moved", func() error {
		_, err := sup.MoveDisk(ctx, "ovd", "data", supervisor.MoveOptions{To: moved})
		return err
	})
	step("backed up", func() error {
		_, err := sup.Backup(ctx, "ovd", supervisor.BackupOptions{Dir: filepath.Join(dir, "bk")})
		return err
	})
	files, _ := filepath.Glob(filepath.Join(images, "ovd-*"))
	bk, _ := filepath.Glob(filepath.Join(dir, "bk", "*.qcow2"))
	files = append(files, bk...)
	if len(files) < 3 {
		t.Fatalf("images %v: want the disk's own, the moved one and a backup", files)
	}
	supervisortest.NoACLs(t, "running", files)
	supervisortest.StopByUnit(t, ctx, env.Systemd, "ovd")
	supervisortest.NoACLs(t, "stopped", files)
}

// onlyDescriptors fails unless QEMU's argv names nothing under the test's
// places (the image directory, the VM file's directory) and every block
// node's file and backing are /dev/fdset/N or in the state directory
// (json: names checked filename by filename).
func onlyDescriptors(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, st supervisor.Status, when string, places ...string) {
	t.Helper()
	pids, err := env.Systemd.HostPIDs("vmsup-" + st.Name + ".service")
	if err != nil || len(pids) != 1 {
		t.Fatalf("%s: QEMU's pids %v %v", when, pids, err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	if err != nil || !strings.Contains(string(cmdline), "qemu-system") {
		t.Fatalf("%s: process %d is not QEMU: %q %v", when, pids[0], cmdline, err)
	}
	for _, a := range strings.Split(string(cmdline), "\x00") {
		for _, p := range places {
			if strings.Contains(a, p+"/") {
				t.Errorf("%s: QEMU's argv names %s: %s", when, p, a)
			}
		}
	}
	reply, err := sup.QMP(ctx, st.Name, []byte(`{"execute":"query-named-block-nodes"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	var nodes struct {
		Return []struct {
			NodeName string `json:"node-name"`
			File     string `json:"file"`
			Backing  string `json:"backing_file"`
		} `json:"return"`
	}
	if err := json.Unmarshal(reply, &nodes); err != nil {
		t.Fatalf("query-named-block-nodes: %v\n%s", err, reply)
	}
	inJSON := regexp.MustCompile(`"filename": *"([^"]*)"`)
	fine := func(name string) bool {
		return name == "" || regexp.MustCompile(`^/dev/fdset/[0-9]+$`).MatchString(name) || strings.HasPrefix(name, st.StateDir+"/")
	}
	for _, n := range nodes.Return {
		for _, name := range []string{n.File, n.Backing} {
			names := []string{name}
			if strings.HasPrefix(name, "json:") {
				names = nil
				for _, m := range inJSON.FindAllStringSubmatch(name, -1) {
					names = append(names, m[1])
				}
			}
			for _, nm := range names {
				if !fine(nm) {
					t.Errorf("%s: block node %s opens %s (%s)", when, n.NodeName, nm, name)
				}
			}
		}
	}
}
