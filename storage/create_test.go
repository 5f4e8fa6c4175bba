package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCreateKilled: a creation killed while qemu-img writes (here a
// qemu-img that writes half a header and hangs, stopped by its timeout)
// leaves nothing at the image's path; the part file a SIGKILLed vmsup
// leaves is removed by the next creation, which makes a whole overlay.
func TestCreateKilled(t *testing.T) {
	tl := needQemuImg(t)
	dir := t.TempDir()
	base, path := filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", base, "16M")
	hang := filepath.Join(dir, "qemu-img")
	script := "#!/bin/sh\nfor a; do case $a in *.vmsup-part) printf QFI > \"$a\";; esac; done\nexec sleep 30\n"
	if err := os.WriteFile(hang, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	err := Tools{QemuImg: hang, Timeout: 300 * time.Millisecond}.Create(context.Background(), path, "qcow2", 0, base, "qcow2")
	if err == nil {
		t.Fatal("a hung qemu-img's creation succeeded")
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a killed creation left %s: %v", path, err)
	}
	// A SIGKILLed vmsup leaves its part file (half-written).
	if err := os.WriteFile(PartFile(path), []byte("QFI"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := tl.Create(context.Background(), path, "qcow2", 0, base, "qcow2"); err != nil {
		t.Fatalf("create after a killed one: %v", err)
	}
	if _, err := os.Lstat(PartFile(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("part file left: %v", err)
	}
	info, err := tl.Info(context.Background(), path, "qcow2")
	if err != nil || info.BackingFilename != base {
		t.Fatalf("the new overlay: %+v, %v", info, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	// Never over an existing file.
	if err := tl.Create(context.Background(), path, "qcow2", 0, base, "qcow2"); !errors.Is(err, os.ErrExist) {
		t.Fatalf("create over an existing image: %v", err)
	}
}
