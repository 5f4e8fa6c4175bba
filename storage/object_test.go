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

// TestOpenBeneathAs: opened as another user, a file that user cannot read
// is refused even to root, one it can read opens, and the caller's
// threads keep their own identity; ProcCred reads a process's identity.
func TestOpenBeneathAs(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (to take another user's file-system identity)")
	}
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "root-only"), []byte("s"), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "shared"), []byte("d"), 0o644))
	nobody := Cred{UID: 65534, GID: 65534}
	if f, err := OpenBeneathAs(dir, "root-only", os.O_RDONLY, nobody); err == nil || !errors.Is(err, os.ErrPermission) {
		t.Errorf("root-only file as nobody: %v, want permission denied", err)
		if f != nil {
			f.Close()
		}
	}
	f, err := OpenBeneathAs(dir, "shared", os.O_RDONLY, nobody)
	if err != nil {
		t.Fatalf("readable file as nobody: %v", err)
	}
	f.Close()
	if _, err := OpenBeneathAs(dir, "shared", os.O_RDWR, nobody); !errors.Is(err, os.ErrPermission) {
		t.Errorf("read-write open of a 0644 root file as nobody: %v", err)
	}
	if _, err := os.Open(filepath.Join(dir, "root-only")); err != nil {
		t.Errorf("root lost its identity: %v", err)
	}
	c, err := ProcCred(os.Getpid())
	if err != nil || c.UID != 0 || c.GID != 0 {
		t.Errorf("ProcCred(self): %+v %v", c, err)
	}
}
