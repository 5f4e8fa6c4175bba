package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ErrTooLarge is a source longer than CopyAt's bound.
var ErrTooLarge = errors.New("is larger than the bound")

// CopyAt replaces the entry name of the directory dir (a descriptor, O_PATH
// will do) with a copy of src's content from its start, at most max bytes
// (a longer source is ErrTooLarge and nothing is replaced), mode perm. It
// writes a temporary file beside name, created with O_EXCL (a name planted
// there is never followed), and renames it over name, which replaces the
// entry itself whatever it is (a symlink included): a reader sees the old
// file or the whole copy. The content is cloned where the file system
// shares extents (FICLONE: btrfs, XFS), else copied in the kernel
// (copy_file_range), else read and written. Nothing is synced: the copy is
// made again wherever it is needed anew (a VM's boot files, at each
// start). It returns the bytes copied.
func CopyAt(dir *os.File, name string, src *os.File, perm os.FileMode, max int64) (int64, error) {
	dfd := int(dir.Fd())
	var tmp string
	var fd int
	for range 8 {
		var b [6]byte
		_, _ = rand.Read(b[:])
		tmp = "." + name + "." + hex.EncodeToString(b[:])
		var err error
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) {
			return 0, fmt.Errorf("create %s in %s: %w", tmp, dir.Name(), err)
		}
		fd = -1
	}
	if fd < 0 {
		return 0, fmt.Errorf("create a temporary file for %s in %s: %w", name, dir.Name(), unix.EEXIST)
	}
	out := os.NewFile(uintptr(fd), tmp)
	n, err := copyContent(out, src, max)
	if err == nil {
		err = out.Chmod(perm.Perm()) // not the umask's
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return n, fmt.Errorf("copy %s to %s/%s: %w", src.Name(), dir.Name(), name, err)
	}
	return n, nil
}

// copyContent copies src from offset 0 to dst (empty), at most max bytes.
func copyContent(dst, src *os.File, max int64) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return 0, err
	}
	if st.Size > max {
		return 0, fmt.Errorf("%s (%d bytes) %w (%d)", src.Name(), st.Size, ErrTooLarge, max)
	}
	if unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil {
		if err := unix.Fstat(int(dst.Fd()), &st); err != nil || st.Size > max {
			return 0, fmt.Errorf("%s %w (%d): it grew while it was cloned", src.Name(), ErrTooLarge, max)
		}
		return st.Size, nil
	}
	var n, off int64
	for n <= max {
		w, err := unix.CopyFileRange(int(src.Fd()), &off, int(dst.Fd()), nil, int(min(max+1-n, 1<<30)), 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case n == 0 && (errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
			errors.Is(err, unix.EOPNOTSUPP)):
			// No in-kernel copy between these two: read and write.
			c, err := io.Copy(dst, io.NewSectionReader(src, 0, max+1))
			return checkMax(src, c, max, err)
		case err != nil:
			return n, err
		case w == 0:
			return n, nil
		}
		n += int64(w)
	}
	return checkMax(src, n, max, nil)
}

func checkMax(src *os.File, n, max int64, err error) (int64, error) {
	if err == nil && n > max {
		err = fmt.Errorf("%s %w (%d): it grew while it was copied", src.Name(), ErrTooLarge, max)
	}
	return n, err
}
