package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// A new image is made under a name of its own beside its final one (a
// "part" file), synced, then renamed into place: a command killed while
// qemu-img writes leaves no 0-byte or half-written image at the disk's
// path (which every later start would refuse as "not in qcow2 format"),
// only a part file the next creation of that path removes.

// PartFile is the name an image at path is made under until it is whole.
func PartFile(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".vmsup-part")
}

// createAtomic makes path with write (which writes the image at the part
// file it is given), never over an existing file.
func createAtomic(path string, write func(part string) error) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("create %s: %w", path, os.ErrExist)
	}
	part := PartFile(path)
	os.Remove(part) // a killed creation's: the part name is vmsup's own
	// Made here first, owner only: qemu-img would create it world-readable.
	// Per-VM ACL grants give QEMU access.
	f, err := os.OpenFile(part, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()
	if err := write(part); err != nil {
		os.Remove(part)
		return err
	}
	if err := syncPath(part); err != nil {
		os.Remove(part)
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := renameNoReplace(part, path); err != nil {
		os.Remove(part)
		return fmt.Errorf("create %s: %w", path, err)
	}
	return syncPath(filepath.Dir(path))
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// renameNoReplace renames from to to unless to exists (a link and an
// unlink where the filesystem has no RENAME_NOREPLACE).
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if err = os.Link(from, to); err == nil {
			return os.Remove(from)
		}
		return err
	}
	if errors.Is(err, unix.EEXIST) {
		return os.ErrExist
	}
	return err
}
