package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A check on a path is a check on nothing: the kernel resolves the name
// again at the next open (a swapped symlink, a hard link to a host file).
// OpenBeneath opens a file the way vmsup checks it and hands it on: once,
// inside a directory it was allowed to come from, following no symlink,
// and the checks then look at the opened object (Object), never the name.

// ErrNotBeneath is what OpenBeneath returns for a name that leaves its
// directory, goes through a symlink or a magic link: refused, not resolved.
var ErrNotBeneath = errors.New("outside its directory or through a symlink")

// OpenBeneath opens name (absolute, inside dir, or relative to dir) with
// flags, resolving it inside dir only: no "..", absolute symlink or
// symlink of any kind on the way, no /proc magic link (RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS); mounts inside dir are the
// host's own choice and are crossed. O_NOFOLLOW and O_CLOEXEC are always added. dir itself
// is opened with O_PATH|O_DIRECTORY and must not be a symlink at its last
// component.
func OpenBeneath(dir, name string, flags int) (*os.File, error) {
	return openBeneath(dir, name, func(dfd int, rel string) (int, error) { return openat2Beneath(dfd, rel, flags) })
}

// openBeneath resolves name against dir as OpenBeneath says and opens it
// with open (openat2 beneath dfd, as the caller or as another user), giving
// a name that leaves dir or goes through a link the ErrNotBeneath error.
func openBeneath(dir, name string, open func(dfd int, rel string) (int, error)) (*os.File, error) {
	rel, err := relBeneath(dir, name)
	if err != nil {
		return nil, err
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	fd, err := open(dfd, rel)
	full := filepath.Join(dir, rel)
	switch {
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return nil, &os.PathError{Op: "open", Path: full, Err: ErrNotBeneath}
	case err != nil:
		return nil, &os.PathError{Op: "open", Path: full, Err: err}
	}
	return os.NewFile(uintptr(fd), full), nil
}

// openat2Beneath is OpenBeneath's openat2 of rel in dfd.
func openat2Beneath(dfd int, rel string, flags int) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(dfd, rel, &how)
		if err != unix.EINTR && err != unix.EAGAIN {
			return fd, err
		}
	}
}

// relBeneath is name relative to dir, refused if it lexically leaves dir.
func relBeneath(dir, name string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("open %s: directory %q is not absolute", name, dir)
	}
	rel := name
	if filepath.IsAbs(name) {
		r, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(name))
		if err != nil {
			return "", &os.PathError{Op: "open", Path: name, Err: ErrNotBeneath}
		}
		rel = r
	}
	rel = filepath.Clean(rel)
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", &os.PathError{Op: "open", Path: name, Err: ErrNotBeneath}
	}
	return rel, nil
}

// ObjectKind is what an opened file is, as far as a VM's disk goes.
type ObjectKind int

const (
	ObjectRegular ObjectKind = iota + 1 // a regular file
	ObjectBlock                         // a block device
)

// Object is the identity of an opened file: what the checks look at and
// what a record keeps to find the same object again (device and inode,
// not a name).
type Object struct {
	Kind  ObjectKind
	Dev   uint64 // st_dev of the file system holding it
	Ino   uint64
	Rdev  uint64 // a block device's own number
	Links uint64
	UID   uint32
	GID   uint32
	Size  int64
}

// Stat reads f's Object from the descriptor.
func Stat(f *os.File) (Object, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Object{}, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	o := Object{Dev: st.Dev, Ino: st.Ino, Rdev: st.Rdev, Links: uint64(st.Nlink), UID: st.Uid, GID: st.Gid, Size: st.Size}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		o.Kind = ObjectRegular
	case unix.S_IFBLK:
		o.Kind = ObjectBlock
	}
	return o, nil
}

// ErrHardLinked is a regular file with more than one name: another name
// (anywhere on its file system, a root-only host file among them) reaches
// the same data, so giving it to a guest gives that file away.
var ErrHardLinked = errors.New("has more than one hard link")

// ErrUnlinked is a file whose last name went between its open and its
// check: what was opened is no longer what the name stands for.
var ErrUnlinked = errors.New("was removed while it was opened")

// ErrNotDiskObject is a file that is neither a regular file nor a block
// device (a directory, FIFO, socket or character device).
var ErrNotDiskObject = errors.New("is not a regular file or a block device")

// CheckDiskObject opens nothing: it checks an opened file is one a VM may
// be given: a block device, or a regular file with exactly one link.
func CheckDiskObject(f *os.File) (Object, error) {
	o, err := Stat(f)
	if err != nil {
		return o, err
	}
	switch {
	case o.Kind == 0:
		return o, fmt.Errorf("%s %w", f.Name(), ErrNotDiskObject)
	case o.Kind == ObjectRegular && o.Links == 0:
		return o, fmt.Errorf("%s %w", f.Name(), ErrUnlinked)
	case o.Kind == ObjectRegular && o.Links != 1:
		return o, fmt.Errorf("%s %w (%d): refused, a guest would reach every other name of it", f.Name(), ErrHardLinked, o.Links)
	}
	return o, nil
}

// Same says whether two Objects are the same file.
func (o Object) Same(p Object) bool { return o.Dev == p.Dev && o.Ino == p.Ino }
