package storage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenBeneath: a name is opened inside its directory only, through no
// symlink (final or on the way), no ".." and no absolute path elsewhere;
// and the opened object is what the checks look at: a second hard link, a
// directory or a FIFO is refused whatever the name.
func TestOpenBeneath(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	must(t, os.WriteFile(secret, []byte("s"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "disk.raw"), []byte("d"), 0o600))
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "sub", "x.raw"), []byte("x"), 0o600))
	must(t, os.Symlink(secret, filepath.Join(dir, "abs-link")))
	must(t, os.Symlink("disk.raw", filepath.Join(dir, "rel-link")))
	must(t, os.Symlink(filepath.Join(dir, "sub"), filepath.Join(dir, "dir-link")))
	must(t, os.Link(filepath.Join(dir, "disk.raw"), filepath.Join(dir, "second-name")))
	must(t, unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))

	for _, c := range []struct {
		name    string
		openErr error // from OpenBeneath
		objErr  error // from CheckDiskObject
	}{
		{"sub/x.raw", nil, nil},
		{filepath.Join(dir, "sub", "x.raw"), nil, nil},
		{"abs-link", ErrNotBeneath, nil},
		{"rel-link", ErrNotBeneath, nil},
		{"dir-link/x.raw", ErrNotBeneath, nil},
		{"../" + filepath.Base(outside) + "/secret", ErrNotBeneath, nil},
		{secret, ErrNotBeneath, nil},
		{"disk.raw", nil, ErrHardLinked},
		{"second-name", nil, ErrHardLinked},
		{"sub", nil, ErrNotDiskObject},
		{"fifo", nil, ErrNotDiskObject},
	} {
		f, err := OpenBeneath(dir, c.name, unix.O_RDONLY|unix.O_NONBLOCK)
		if !errors.Is(err, c.openErr) || (c.openErr == nil) != (err == nil) {
			t.Errorf("OpenBeneath(%q) = %v, want %v", c.name, err, c.openErr)
			continue
		}
		if err != nil {
			continue
		}
		_, err = CheckDiskObject(f)
		f.Close()
		if !errors.Is(err, c.objErr) || (c.objErr == nil) != (err == nil) {
			t.Errorf("CheckDiskObject(%q) = %v, want %v", c.name, err, c.objErr)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
