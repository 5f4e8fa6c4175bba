package diskfds

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/storage"
)

// TestReopenOther: the second descriptor of a level is the same object in
// the other access mode, whatever its name leads to by then.
func TestReopenOther(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "img")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, flags := range []int{os.O_RDWR, os.O_RDONLY} {
		f, err := os.OpenFile(path, flags, 0)
		if err != nil {
			t.Fatal(err)
		}
		// The name now leads elsewhere: the reopen must not follow it.
		os.Rename(path, path+".old")
		os.WriteFile(path, []byte("other"), 0o600)
		o, err := reopenOther(f)
		if err != nil {
			t.Fatal(err)
		}
		fl, _ := unix.FcntlInt(o.Fd(), unix.F_GETFL, 0)
		want := unix.O_RDWR
		if flags == os.O_RDWR {
			want = unix.O_RDONLY
		}
		if fl&unix.O_ACCMODE != want {
			t.Errorf("reopen of a %#x descriptor has access mode %#x, want %#x", flags, fl&unix.O_ACCMODE, want)
		}
		a, _ := storage.Stat(f)
		b, _ := storage.Stat(o)
		if a.Ino != b.Ino || a.Dev != b.Dev {
			t.Errorf("reopen gave another object")
		}
		f.Close()
		o.Close()
		os.Remove(path)
		os.Rename(path+".old", path)
	}
}

// TestDirectFlags: a level of a disk with cache.direct goes to QEMU with
// O_DIRECT on both its descriptors (QEMU 10 takes from an fd set only a
// descriptor whose O_DIRECT matches its open's), one without it without,
// and neither keeps the checks' O_NONBLOCK.
func TestDirectFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, direct := range []bool{true, false} {
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_NONBLOCK|unix.O_DIRECT, 0)
		if err != nil {
			t.Skipf("this file system has no O_DIRECT: %v", err)
		}
		if err := setFlags(f, direct); err != nil {
			t.Fatal(err)
		}
		o, err := reopenOther(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []*os.File{f, o} {
			fl, _ := unix.FcntlInt(x.Fd(), unix.F_GETFL, 0)
			if fl&unix.O_DIRECT != 0 != direct || fl&unix.O_NONBLOCK != 0 {
				t.Errorf("direct %v: descriptor flags %#x (access mode %d)", direct, fl, fl&unix.O_ACCMODE)
			}
		}
		f.Close()
		o.Close()
	}
}
