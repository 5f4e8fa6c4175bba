package consolelog

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"time"
)

// Position is a place in a log, to follow it from: a file, by its identity
// (which a rotation's rename keeps), and an offset in it. The zero Position
// is the log's start.
type Position struct {
	id  ident
	off int64
}

// Tail is the end of a log, read back.
type Tail struct {
	Data []byte
	// Cut says the log has, or may have had, bytes before Data: left out
	// by the limit, or rotated away (the oldest file's slot is taken).
	// Data's first line may then be partial.
	Cut bool
	End Position // where Data ends: Follow from here
	// Times says when Data's bytes were written (TimeAt), in Off order;
	// the first is at 0.
	Times []Stamp
}

// ReadBack returns the last limit bytes of the log, across its files.
func ReadBack(c Config, limit int64) (Tail, error) {
	if err := c.Validate(); err != nil {
		return Tail{}, err
	}
	fs, err := snapshot(c)
	if err != nil || len(fs) == 0 {
		return Tail{}, err
	}
	defer closeFiles(fs)
	var total int64
	for _, f := range fs {
		total += f.size
	}
	n := min(total, max(limit, 0))
	b := make([]byte, n)
	at, skip, end := int64(0), total-n, int64(0)
	var times []Stamp
	for _, f := range fs {
		if skip >= f.size {
			skip -= f.size
			end = f.size
			continue
		}
		times = append(times, fileStamps(c.name(f.slot), f, skip, at)...)
		// The sizes are the snapshot's: what was written since is Follow's.
		m, err := f.f.ReadAt(b[at:at+f.size-skip], skip)
		if err != nil && err != io.EOF {
			return Tail{}, err
		}
		at += int64(m)
		end = skip + int64(m)
		skip = 0
	}
	last := fs[len(fs)-1]
	return Tail{
		Data:  b[:at],
		Cut:   total > n || c.Keep > 1 && fs[0].slot == c.Keep-1,
		End:   Position{id: last.id, off: end},
		Times: times,
	}, nil
}

// pollEvery is how often Follow looks for more.
const pollEvery = 200 * time.Millisecond

// Follow calls fn with what is written to the log from `from` on, in order,
// each byte once, until ctx ends (it returns ctx's error). It polls. A
// rotation is seen by Path being another file: the rest of the followed
// one (held open, wherever it went) is read first, then the files after
// it; so up to Keep rotations between two polls lose nothing. A file that
// shrank (truncated: a log started anew) is read again from its start.
// fn's slice is only valid during the call.
func Follow(ctx context.Context, c Config, from Position, fn func([]byte)) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return follow(ctx, c, from, pollEvery, fn)
}

func follow(ctx context.Context, c Config, from Position, every time.Duration, fn func([]byte)) error {
	fl := &follower{c: c, pos: from, buf: make([]byte, bufSize), fn: fn}
	defer fl.close()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		fl.step()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// follower is Follow's state between two polls.
type follower struct {
	c   Config
	pos Position
	cur *os.File // the file at pos, held open: its rest can be read after a rotation
	buf []byte
	fn  func([]byte)
}

// step reads what was written since the last step.
func (fl *follower) step() {
	if fl.cur != nil {
		fl.pos.off = fl.readOn(fl.cur, fl.pos.off)
		if fi, err := os.Lstat(fl.c.Path); err == nil && identOf(fi) == fl.pos.id {
			return
		}
	}
	// Path is another file (or there was none): read on through the files
	// after the followed one, or all of them if it is gone (rotated away,
	// or there was none).
	fs, err := snapshot(fl.c)
	if err != nil || len(fs) == 0 {
		return
	}
	i := slices.IndexFunc(fs, func(f file) bool { return f.id == fl.pos.id })
	off := fl.pos.off
	if i < 0 {
		i, off = 0, 0
	}
	for j := i; j < len(fs); j++ {
		if j > i {
			off = 0
		}
		off = fl.readOn(fs[j].f, off)
	}
	last := fs[len(fs)-1]
	closeFiles(fs[:len(fs)-1])
	fl.close()
	fl.cur, fl.pos = last.f, Position{id: last.id, off: off}
}

// readOn passes f's bytes from off to its end to fn, and returns the end.
func (fl *follower) readOn(f *os.File, off int64) int64 {
	if fi, err := f.Stat(); err == nil && fi.Size() < off {
		off = 0
	}
	for {
		n, err := f.ReadAt(fl.buf, off)
		if n > 0 {
			fl.fn(fl.buf[:n])
			off += int64(n)
		}
		if err != nil || n == 0 {
			return off
		}
	}
}

func (fl *follower) close() {
	if fl.cur != nil {
		fl.cur.Close()
		fl.cur = nil
	}
}

// file is one of a log's files, open.
type file struct {
	f    *os.File
	slot int // 0: Path, i: Path.i
	id   ident
	size int64
}

// snapshot opens the log's files, oldest first, as one consistent sequence.
func snapshot(c Config) ([]file, error) {
	for range 100 {
		fs, ok := openFiles(c)
		if ok {
			return fs, nil
		}
		closeFiles(fs)
		time.Sleep(100 * time.Microsecond)
	}
	return nil, fmt.Errorf("read %s: rotated too often to be read", c.Path)
}

// openFiles opens the files newest first, then checks that Path is still
// the file it opened first and that no file was opened twice: else a
// rotation renamed them meanwhile. Each file held open keeps its identity
// from being reused. A rotation's renames go oldest first: one under way
// may hide a file about to go, never reorder them.
func openFiles(c Config) (fs []file, ok bool) {
	for i := range c.Keep {
		if f, err := openFile(c.name(i), i); err == nil {
			fs = append(fs, f)
		}
	}
	var first, now ident
	if len(fs) > 0 && fs[0].slot == 0 {
		first = fs[0].id
	}
	if fi, err := os.Lstat(c.Path); err == nil && fi.Mode().IsRegular() {
		now = identOf(fi)
	}
	if now != first {
		return fs, false
	}
	for i := range fs {
		for _, g := range fs[:i] {
			if g.id == fs[i].id {
				return fs, false
			}
		}
	}
	slices.Reverse(fs)
	return fs, true
}

// openFile opens a regular file of the log. O_NOFOLLOW, and O_NONBLOCK
// against a FIFO put there: the directory is QEMU's user's.
func openFile(name string, slot int) (file, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return file{}, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file", name)
	}
	if err != nil {
		f.Close()
		return file{}, err
	}
	return file{f: f, slot: slot, id: identOf(fi), size: fi.Size()}, nil
}

func closeFiles(fs []file) {
	for _, f := range fs {
		f.f.Close()
	}
}
