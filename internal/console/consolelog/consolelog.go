// Package consolelog owns a VM's serial console log. QEMU writes what the
// guest prints on its console to a FIFO (its chardev's logfile=, see
// MakeFIFO), and Run, one small process per QEMU run, copies it into files
// of at most MaxBytes each, rotated like Path, Path.1, … Path.(Keep-1), so
// that the log never takes more than Keep×MaxBytes, with beside each file
// an index of when its bytes were written (times.go; at most a quarter of
// its file). Files, ReadBack and Follow read the log back across the
// rotation, ReadBack with the times.
package consolelog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// The defaults: the last 1 to 2 MiB of a guest's console are kept.
const (
	DefaultMaxBytes = 1 << 20
	DefaultKeep     = 2
)

// MinMaxBytes is the smallest MaxBytes: a file holds at least a screenful.
const MinMaxBytes = 4 << 10

// bufSize is the one buffer Run reads the FIFO with (and Follow the files).
const bufSize = 32 << 10

// Config is where a console log is kept and how much of it.
type Config struct {
	Path     string // the current file; the older ones are Path.1 (the newest) … Path.(Keep-1)
	MaxBytes int64  // each file's cap: the log never takes more than Keep×MaxBytes
	Keep     int    // how many files, the current one included
}

// Default is the log kept at path with the default bounds.
func Default(path string) Config {
	return Config{Path: path, MaxBytes: DefaultMaxBytes, Keep: DefaultKeep}
}

// Validate says what is wrong with c, if anything.
func (c Config) Validate() error {
	switch {
	case c.Path == "":
		return errors.New("console log: no path")
	case c.MaxBytes < MinMaxBytes:
		return fmt.Errorf("console log %s: MaxBytes %d is less than %d", c.Path, c.MaxBytes, MinMaxBytes)
	case c.Keep < 1:
		return fmt.Errorf("console log %s: Keep %d is less than 1", c.Path, c.Keep)
	}
	return nil
}

// name is the file in slot i: 0 is Path, the current file.
func (c Config) name(i int) string {
	if i == 0 {
		return c.Path
	}
	return c.Path + "." + strconv.Itoa(i)
}

// Files returns the log's files that exist, oldest first.
func Files(c Config) []string {
	var out []string
	for i := c.Keep - 1; i >= 0; i-- {
		if fi, err := os.Lstat(c.name(i)); err == nil && fi.Mode().IsRegular() {
			out = append(out, c.name(i))
		}
	}
	return out
}

// Chown gives the log's files (each kept file, its times, the lock) to
// uid:gid, the logger's user; missing ones are skipped, and a symlink put
// in their place is changed itself, not followed.
func Chown(c Config, uid, gid int) error {
	names := []string{c.Path + ".lock"}
	for i := 0; i < max(c.Keep, 1); i++ {
		names = append(names, c.name(i), timesPath(c.name(i)))
	}
	for _, n := range names {
		if err := os.Lchown(n, uid, gid); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// MakeFIFO creates the FIFO QEMU writes the console to at path (replacing
// whatever is there), owned by uid:gid with mode 0600: only QEMU's user
// (and root) can write to it.
func MakeFIFO(path string, uid, gid int) error {
	// Made aside and renamed: path is never missing or half set up.
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		return &os.PathError{Op: "mkfifo", Path: tmp, Err: err}
	}
	if err := ownFIFO(tmp, uid, gid); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// ownFIFO sets the FIFO's owner and mode through an fd: mkfifo's mode is cut
// by the umask, and a chown or chmod by path would follow a symlink (or a
// hard link) put in its place, the directory being QEMU's user's.
func ownFIFO(name string, uid, gid int) error {
	// Non-blocking: an open for reading alone waits for a writer.
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); fi.Mode().Type() != fs.ModeNamedPipe || !ok || st.Nlink != 1 {
		return fmt.Errorf("%s: not the FIFO just made", name)
	}
	if err := f.Chown(uid, gid); err != nil {
		return err
	}
	return f.Chmod(0o600)
}

// ident is a file's identity, which a rename keeps.
type ident struct{ dev, ino uint64 }

func identOf(fi os.FileInfo) ident {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ident{}
	}
	return ident{uint64(st.Dev), st.Ino}
}
