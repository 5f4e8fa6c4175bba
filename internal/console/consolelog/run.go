package consolelog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Run copies what is written to the FIFO into the log c, as it comes (a
// console prompt has no newline), until the writer closes it (nil) or ctx
// ends (ctx's error). It first waits for a writer, for at most firstWriter
// (none: as long as ctx lasts). The log is appended to: a new QEMU run
// continues it.
//
// Run never stops reading while it runs, so QEMU, whose console write
// blocks on a full FIFO, never waits on it: data it cannot write (a full
// disk) is dropped, it tries again with the next, and the first such error
// is returned at the end. Run must be the only writer of the log's files
// meanwhile: it counts their sizes itself.
func Run(ctx context.Context, fifo string, c Config, firstWriter time.Duration) error {
	if err := c.Validate(); err != nil {
		return err
	}
	// Non-blocking: a blocking open(2) would wait for QEMU's, deaf to ctx.
	// Once this read end is open, QEMU's open returns.
	in, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return err
	} else if fi.Mode().Type() != fs.ModeNamedPipe {
		return fmt.Errorf("%s: not a FIFO", fifo)
	}
	// Closing it ends a wait or a read, which a deadline set meanwhile
	// for firstWriter could not undo.
	defer context.AfterFunc(ctx, func() { in.Close() })()

	if err := waitWriter(in, firstWriter); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("no writer on %s within %s: %w", fifo, firstWriter, err)
		}
		return fmt.Errorf("%s: %w", fifo, err)
	}
	return copyIn(ctx, in, c, 0)
}

// Serve is Run for a FIFO that systemd holds (units.FIFOSocket) and
// passed as in: it copies what comes into the log c until nothing came for
// idle (nil), in fails, or ctx ends (ctx's error). It never sees EOF, the
// socket holding the FIFO open for writing: what comes after it returns
// waits in the FIFO, and systemd starts the logger again for it.
func Serve(ctx context.Context, in *os.File, c Config, idle time.Duration) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if idle <= 0 {
		return fmt.Errorf("console log %s: idle %s is not positive", c.Path, idle)
	}
	if fi, err := in.Stat(); err != nil {
		return err
	} else if fi.Mode().Type() != fs.ModeNamedPipe {
		return fmt.Errorf("%s: not a FIFO", in.Name())
	}
	defer context.AfterFunc(ctx, func() { in.Close() })()
	return copyIn(ctx, in, c, idle)
}

// copyIn copies in into the log c until EOF, or until nothing came for
// idle (0: no bound).
func copyIn(ctx context.Context, in *os.File, c Config, idle time.Duration) error {
	// Another logger of the same log (a local migration's source QEMU's)
	// finishes first; meanwhile the FIFO holds what this QEMU writes.
	unlock, err := lockLog(ctx, c)
	if err != nil {
		return err
	}
	defer unlock()
	w := openLog(c)
	defer w.close()
	buf := make([]byte, bufSize)
	for {
		if idle > 0 {
			if err := in.SetReadDeadline(time.Now().Add(idle)); err != nil {
				return errors.Join(err, w.err)
			}
		}
		n, err := in.Read(buf)
		w.write(buf[:n])
		switch {
		case err == io.EOF || idle > 0 && errors.Is(err, os.ErrDeadlineExceeded):
			return w.err
		case err != nil && ctx.Err() != nil:
			return errors.Join(ctx.Err(), w.err)
		case err != nil:
			return errors.Join(err, w.err)
		}
	}
}

// waitWriter waits until a writer has opened the FIFO: it has data
// (POLLIN), or its writer came and went (POLLHUP). Linux reports neither
// before a first writer, when a read would return EOF at once.
func waitWriter(in *os.File, d time.Duration) error {
	if d > 0 {
		if err := in.SetReadDeadline(time.Now().Add(d)); err != nil {
			return err
		}
		defer in.SetReadDeadline(time.Time{})
	}
	rc, err := in.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	// The poller calls this again each time the FIFO may have changed.
	err = rc.Read(func(fd uintptr) bool {
		p := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, perr = unix.Poll(p[:], 0); perr != unix.EINTR {
				break
			}
		}
		return perr != nil || p[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0
	})
	if err != nil {
		return err
	}
	return perr
}

// writer appends to a log, rotating it at MaxBytes, and records when
// (times.go).
type writer struct {
	c     Config
	f     *os.File // Path; nil: to open before the next write
	size  int64    // f's: counted, not asked for each write
	times *stamps  // f's index; nil with f
	now   func() time.Time
	err   error // the first error
}

// openLog opens the log to append to, rotating it first if its current
// file is full, and bringing it within c's bounds: a previous run may have
// had larger ones (or none, before the logger). Errors are kept for Run to
// return: the log may do better by the first write.
func openLog(c Config) *writer { return openRun(c, false) }

// openRun is openLog that, for a new run, first moves a current file
// holding anything to Path.1.
func openRun(c Config, newRun bool) *writer {
	w := &writer{c: c, now: time.Now}
	for i := c.Keep; ; i++ {
		// a file beyond Keep: a previous run kept more
		os.Remove(timesPath(c.name(i)))
		if os.Remove(c.name(i)) != nil {
			break
		}
	}
	if !w.note(w.open()) && (w.size >= c.MaxBytes || newRun && w.size > 0) {
		w.note(w.rotate())
	}
	for i := 1; i < c.Keep; i++ {
		w.note(trim(c.name(i), c.MaxBytes))
	}
	return w
}

// note keeps err if it is the first, and says whether there was one.
func (w *writer) note(err error) bool {
	if err != nil && w.err == nil {
		w.err = err
	}
	return err != nil
}

func (w *writer) open() error {
	// O_NOFOLLOW, and O_NONBLOCK against a FIFO put there: the directory is
	// QEMU's user's.
	f, err := os.OpenFile(w.c.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file", w.c.Path)
	}
	if err != nil {
		f.Close()
		return err
	}
	w.f, w.size = f, fi.Size()
	w.times = openStamps(w.c.Path, f, identOf(fi), w.size)
	return nil
}

// write appends b, rotating the log each time the current file is full:
// every file but the current one holds exactly MaxBytes.
func (w *writer) write(b []byte) {
	now := w.now()
	for len(b) > 0 {
		if w.f == nil && w.note(w.open()) {
			return
		}
		if w.size >= w.c.MaxBytes && w.note(w.rotate()) {
			return
		}
		w.times.stamp(w.size, now)
		n, err := w.f.Write(b[:min(int64(len(b)), w.c.MaxBytes-w.size)])
		w.size += int64(n)
		b = b[n:]
		if w.note(err) {
			// Opened again for the next write: its size is then the file's.
			w.close()
			return
		}
	}
}

// rotate shifts the files by one (Path.(Keep-2) over Path.(Keep-1), …,
// Path to Path.1) and starts a new Path. A reader tells by Path's identity.
func (w *writer) rotate() error {
	w.close()
	if w.c.Keep == 1 {
		if err := os.Remove(w.c.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		os.Remove(timesPath(w.c.Path))
	}
	for i := w.c.Keep - 1; i > 0; i-- {
		if err := os.Rename(w.c.name(i-1), w.c.name(i)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := renameTimes(w.c.name(i-1), w.c.name(i)); err != nil {
			return err
		}
	}
	return w.open()
}

func (w *writer) close() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
		w.times.close()
		w.times = nil
	}
}

// trim keeps the last n bytes of the file name, if it has more.
func trim(name string, n int64) error {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() <= n {
		return err
	}
	if _, err := f.Seek(fi.Size()-n, io.SeekStart); err != nil {
		return err
	}
	tmp := name + ".trim"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	t, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(t, io.LimitReader(f, n))
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		os.Remove(timesPath(name)) // of the file replaced
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("trim %s: %w", name, err)
	}
	return nil
}

// lockWait bounds the wait for another logger of the same log: past it,
// this one writes anyway (the source QEMU of a migration is long gone).
const lockWait = 30 * time.Second

// lockLog takes the log's lock (Path.lock, an flock): one logger writes
// the files at a time.
func lockLog(ctx context.Context, c Config) (func(), error) {
	f, err := os.OpenFile(c.Path+".lock", os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("console log lock: %w", err)
	}
	deadline := time.Now().Add(lockWait)
	for unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return func() { f.Close() }, nil
}

// StartRun begins a new run of the log before its QEMU starts: the current
// file, if it holds anything, becomes Path.1. Done by the starter, not the
// logger, so that the log holds no line of the previous guest from the
// moment the new QEMU runs.
func StartRun(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	w := openRun(c, true)
	w.close()
	return w.err
}
