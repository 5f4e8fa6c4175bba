// Package userfile reads and checks files a user names (a VM's TOML, cloud-
// init user data, a secret, a disk spec) without trusting them: opened
// without blocking, so a FIFO or a device never holds a vmsup (and the VM's
// lock) forever; refused unless it is a regular file; read up to a limit,
// so /dev/zero or a huge file cannot exhaust the host's memory.
package userfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Limits of the files vmsup reads.
const (
	MaxSpec     = 1 << 20  // a VM's TOML file (a large one is a few KiB)
	MaxSeedFile = 16 << 20 // cloud-init user data, meta data, network config
	MaxSecret   = 64 << 10 // a password or key file
)

// Read returns the contents of the regular file at path, at most max bytes;
// a larger file is an error naming both sizes.
func Read(path string, max int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: %s, more than the %s vmsup reads", path, human(fi.Size()), human(max))
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1)) // it may grow meanwhile
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: more than the %s vmsup reads", path, human(max))
	}
	return b, nil
}

// Open opens path for reading without blocking (O_NONBLOCK: a FIFO with no
// writer would block open itself) and checks with fstat that it is a
// regular file; the file is then switched back to blocking reads.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &NotRegularError{Path: path, Mode: fi.Mode()}
	}
	if err := unix.SetNonblock(int(f.Fd()), false); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// NotRegularError is a path that is a FIFO, socket, device or directory
// where a regular file is expected.
type NotRegularError struct {
	Path string
	Mode fs.FileMode
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("%s is %s, not a regular file", e.Path, Kind(e.Mode))
}

// Kind names a file mode's type for messages ("a FIFO").
func Kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "not a regular file"
}

func human(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
