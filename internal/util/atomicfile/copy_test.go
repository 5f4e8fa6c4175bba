package atomicfile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyAt: the copy replaces the entry (a symlink planted there
// included, never followed), has the source's bytes and the mode asked
// for, and leaves no temporary file; a source over the bound replaces
// nothing.
func TestCopyAt(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	data := bytes.Repeat([]byte("kernel "), 300000) // 2.1 MB: several copy_file_range calls' worth on some kernels
	src := filepath.Join(other, "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(other, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "kernel")); err != nil {
		t.Fatal(err)
	}
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	n, err := CopyAt(d, "kernel", in, 0o600, 1<<30)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("CopyAt: %d, %v", n, err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "kernel"))
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("the copy: %d bytes, %v; want the source's %d", len(got), err, len(data))
	}
	if fi, err := os.Lstat(filepath.Join(dir, "kernel")); err != nil || fi.Mode() != 0o600 {
		t.Errorf("the copy's mode: %v %v, want a 0600 regular file", fi.Mode(), err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the symlink's target was written: %q", b)
	}
	if _, err := CopyAt(d, "kernel", in, 0o600, 1000); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the bound: %v, want ErrTooLarge", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "kernel")); !bytes.Equal(got, data) {
		t.Error("a refused copy replaced the file")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("entries left: %v", ents)
	}
}
