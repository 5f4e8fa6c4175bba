package consolelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// When the bytes were written: each file of the log has an index beside
// it, NAME.times, which Run writes and ReadBack reads, so that a line read
// back has the time it was written, as one followed has the time it was
// seen. The index holds the identity of its log file, its inode and birth
// time (a rotation's rename keeps both; a file trimmed or replaced is
// another, even on a reused inode, and an index of another file is
// ignored), then records of (offset, Unix milliseconds):
// the file's bytes from offset on were written at or after that time. Run
// adds one for a write that comes at least timesEvery after the last one
// recorded, while the index is within its budget: a quarter of its log
// file's size (timesFloor at least), so the log and its indexes never take
// more than 1.25×Keep×MaxBytes. A guest that writes a few bytes at a time
// for long then gets coarser times (each the time of an earlier write),
// never wrong ones.

// timesSuffix names a log file's index.
const timesSuffix = ".times"

// timesMagic starts an index (and versions its format).
const timesMagic = "vmsup-console-times-1\n"

// timesEvery is the finest time resolution: writes closer together share
// the first one's record.
const timesEvery = 100 * time.Millisecond

// timesFloor is the index's budget whatever its file's size.
const timesFloor = 4 << 10

// timesPath is the index of the log file name.
func timesPath(name string) string { return name + timesSuffix }

// timesHeader is an index's start for the log file f, of identity id.
func timesHeader(f *os.File, id ident) []byte {
	b := []byte(timesMagic)
	b = binary.AppendUvarint(b, id.dev)
	b = binary.AppendUvarint(b, id.ino)
	return binary.AppendUvarint(b, birth(f))
}

// birth is f's birth time in nanoseconds, 0 where the filesystem keeps none.
func birth(f *os.File) uint64 {
	var st unix.Statx_t
	if unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_BTIME, &st) != nil || st.Mask&unix.STATX_BTIME == 0 {
		return 0
	}
	return uint64(st.Btime.Sec)*1e9 + uint64(st.Btime.Nsec)
}

// stamps is a writer's index of its current file.
type stamps struct {
	f    *os.File // nil: no index (it could not be written)
	size int64
	last time.Time // of the last record; zero before the first
}

// openStamps opens the index of the log file name (open as lf, identity
// id, size bytes): kept and appended to if it is that file's, else made
// anew.
func openStamps(name string, lf *os.File, id ident, size int64) *stamps {
	f, err := os.OpenFile(timesPath(name), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		return &stamps{}
	}
	hdr := timesHeader(lf, id)
	st := &stamps{f: f}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return &stamps{}
	}
	// A log file just begun (its inode may be a removed file's) or
	// another file's index: begin it anew.
	got := make([]byte, len(hdr))
	if _, rerr := f.ReadAt(got, 0); size == 0 || rerr != nil || !bytes.Equal(got, hdr) {
		if f.Truncate(0) != nil {
			f.Close()
			return &stamps{}
		}
		if _, err := f.WriteAt(hdr, 0); err != nil {
			f.Close()
			return &stamps{}
		}
		st.size = int64(len(hdr))
		return st
	}
	st.size = fi.Size()
	return st
}

// stamp records that the log file's bytes from off on are written at
// now, unless a record is that recent already or the index is at its
// budget for a file of off bytes. An index that cannot be written is
// dropped: the times are lost, never the log.
func (st *stamps) stamp(off int64, now time.Time) {
	if st.f == nil || !st.last.IsZero() && now.Sub(st.last) < timesEvery {
		return
	}
	rec := binary.AppendUvarint(nil, uint64(off))
	rec = binary.AppendUvarint(rec, uint64(max(now.UnixMilli(), 0)))
	if st.size+int64(len(rec)) > max(timesFloor, off/4) {
		return
	}
	n, err := st.f.WriteAt(rec, st.size)
	st.size += int64(n)
	if err != nil {
		st.close()
		return
	}
	st.last = now
}

func (st *stamps) close() {
	if st.f != nil {
		st.f.Close()
		st.f = nil
	}
}

// Stamp says when a log's bytes were written: those of Tail.Data from
// Off on, up to the next Stamp, at or after Time (zero: not known).
type Stamp struct {
	Off  int64
	Time time.Time
}

// fileStamps reads the index of f (slot name) and returns its records for
// f's bytes [skip, f.size), as offsets from base: the first at base, with
// the time of the record before skip (zero when unknown).
func fileStamps(name string, f file, skip, base int64) []Stamp {
	out := []Stamp{{Off: base}}
	b, err := readTimes(timesPath(name), f.size/4+timesFloor+int64(len(timesMagic))+5*binary.MaxVarintLen64)
	hdr := timesHeader(f.f, f.id)
	if err != nil || !bytes.HasPrefix(b, hdr) {
		return out
	}
	b = b[len(hdr):]
	for len(b) > 0 {
		off, n := binary.Uvarint(b)
		if n <= 0 {
			break
		}
		ms, m := binary.Uvarint(b[n:])
		if m <= 0 {
			break // a record cut short: the writer died within it
		}
		b = b[n+m:]
		if off >= uint64(f.size) || ms > 1<<53 {
			break // written after f was looked at, or not a time
		}
		t := time.UnixMilli(int64(ms))
		if int64(off) <= skip {
			out[0].Time = t
			continue
		}
		out = append(out, Stamp{Off: base + int64(off) - skip, Time: t})
	}
	return out
}

// readTimes reads an index, at most limit bytes of it.
func readTimes(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// TimeAt is when the byte at off of a Tail's Data was written, from its
// stamps (zero when not known).
func TimeAt(stamps []Stamp, off int64) time.Time {
	i := sort.Search(len(stamps), func(i int) bool { return stamps[i].Off > off })
	if i == 0 {
		return time.Time{}
	}
	return stamps[i-1].Time
}

// renameTimes moves the index of log file from beside to that of to, or
// removes to's when from has none: an index never outlives its place.
func renameTimes(from, to string) error {
	err := os.Rename(timesPath(from), timesPath(to))
	if errors.Is(err, fs.ErrNotExist) {
		err = os.Remove(timesPath(to))
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
