package supervisor_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
)

// TestRemove: rm refuses a running VM; after down it removes the state
// directory, the records and the autostart mark (and the boot unit with the
// last mark), keeps the disk image, and the VM is unknown afterwards.
func TestRemove(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	etc := filepath.Join(dir, "etc")
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps, JournalDir: env.Systemd.JournalDir,
		Self: vmsupBin, UnitDir: etc, BootTarget: testenv.BootTarget, RunDir: filepath.Join(dir, "run"), AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	disk := filepath.Join(dir, "keep.raw")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f := guestFile(t, dir, "gone", fmt.Sprintf("stop_timeout = \"1s\"\n[[disk]]\nname = \"d\"\nfile = %q\nformat = \"raw\"\n", disk))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Enable(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := sup.Remove(ctx, "gone"); err == nil || !strings.Contains(err.Error(), "vmsup down it first") {
		t.Fatalf("rm of a running VM: %v", err)
	}
	if _, err := sup.Down(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := sup.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(root, "vms", "gone"), filepath.Join(root, "records", "gone"),
		filepath.Join(root, "autostart", "gone.toml"), filepath.Join(etc, supervisor.BootUnitName)} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after rm: %v", p, err)
		}
	}
	if _, err := os.Stat(disk); err != nil {
		t.Errorf("rm removed the disk image: %v", err)
	}
	if _, err := sup.Status(ctx, "gone"); !errors.Is(err, supervisor.ErrNotFound) {
		t.Errorf("status after rm: %v", err)
	}
	if ls, _ := sup.List(ctx); len(ls) != 0 {
		t.Errorf("ls after rm: %+v", ls)
	}
	if err := sup.Remove(ctx, "gone"); !errors.Is(err, supervisor.ErrNotFound) {
		t.Errorf("second rm: %v", err)
	}
}
