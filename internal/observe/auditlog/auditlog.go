// Package auditlog appends entries (one JSON object a line) to a log file of
// bounded size that keeps one old generation (PATH.1), and makes the loss
// of old entries visible: a file a rotation starts opens with a Head line
// saying how many entries the log has lost in all. Appends are serialized
// by a lock file beside the log (PATH.lock) and synced to disk.
//
// A log whose caller tells refusals from its other entries (Log.Refusal)
// gives refusals half of the file at most: a flood of them drops the
// oldest refusals, counted in a head, and never rotates the other entries
// out.
//
// It does not decide what an entry holds or bound its size: callers give
// it entries small against Max.
package auditlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Log is one audit log file.
type Log struct {
	Path string
	// Max is the size in bytes past which the file is rotated to PATH.1
	// (replacing the one there) before an append.
	Max int64
	Now func() time.Time // nil = time.Now
	// Refusal, if set, tells a refusal (what anyone can send in bulk)
	// from the other entries. Refusals then take at most half of Max:
	// when the file is full and they take more, the oldest of them are
	// dropped down to a quarter instead of a rotation, so that only the
	// other entries' own volume ever rotates those out.
	Refusal func(entry []byte) bool
}

// Head is the first line of a file a rotation started.
type Head struct {
	Time    time.Time `json:"time"`
	Rotated bool      `json:"rotated"` // always true: how a reader tells a head from an entry
	// Lost is how many entries the log has lost in all: those of the old
	// files rotations replaced.
	Lost int64 `json:"lost"`
	// Refusals is how many of Lost were refusals dropped to keep them to
	// their half of the file (Log.Refusal).
	Refusals int64  `json:"refusals_dropped,omitempty"`
	Note     string `json:"note"`
}

// lockWait bounds the wait for another writer.
const lockWait = 10 * time.Second

// Append adds entry (one line of JSON, without the newline) to the log,
// rotating it first if it would grow past Max.
func (l Log) Append(ctx context.Context, entry []byte) error {
	if bytes.ContainsAny(entry, "\n\r") || !json.Valid(entry) {
		return fmt.Errorf("%s: an entry must be one line of JSON", l.Path)
	}
	unlock, err := l.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if full, err := l.full(len(entry)); err != nil {
		return err
	} else if full && l.Refusal != nil {
		if err := l.dropRefusals(); err != nil {
			return fmt.Errorf("drop refusals from %s: %w", l.Path, err)
		}
	}
	if full, err := l.full(len(entry)); err != nil {
		return err
	} else if full {
		if err := l.rotate(); err != nil {
			return fmt.Errorf("rotate %s: %w", l.Path, err)
		}
	}
	return appendLine(l.Path, entry)
}

// full reports whether an entry of n bytes would take the file past Max.
func (l Log) full(n int) (bool, error) {
	fi, err := os.Stat(l.Path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return fi.Size() > 0 && fi.Size()+int64(n)+1 > l.Max, nil
}

func appendLine(path string, line []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line[:len(line):len(line)], '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// lock takes the log's lock file, waiting at most lockWait.
func (l Log) lock(ctx context.Context) (func(), error) {
	f, err := os.OpenFile(l.Path+".lock", os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	for unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("%s: another writer holds it: %w", l.Path+".lock", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return func() { f.Close() }, nil
}

// rotate moves the log to PATH.1 and starts the new file with a Head
// counting the entries lost in all: those lost before the current file
// (its head) and those of the PATH.1 it replaces.
func (l Log) rotate() error {
	old := l.Path + ".1"
	dropped, err := entries(old)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	before, err := Lost(l.Path)
	if err != nil {
		return err
	}
	lost := before + dropped
	if err := os.Rename(l.Path, old); err != nil {
		return err
	}
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	base := filepath.Base(l.Path)
	prev, _ := readHead(l.Path + ".1")
	h := Head{Time: now().UTC(), Rotated: true, Lost: lost, Refusals: prev.Refusals,
		Note: fmt.Sprintf("%s rotated at %d bytes: %s holds the entries before this file; %d older entries are lost", base, l.Max, base+".1", lost)}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return appendLine(l.Path, b)
}

// entries counts the entries of the file at path (not its head).
func entries(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n int64
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for first := true; sc.Scan(); first = false {
		if _, ok := head(sc.Bytes()); ok && first {
			continue
		}
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			n++
		}
	}
	return n, sc.Err()
}

// head parses line as a Head.
func head(line []byte) (Head, bool) {
	var h Head
	if json.Unmarshal(line, &h) != nil || !h.Rotated {
		return Head{}, false
	}
	return h, true
}

// Lost reports how many entries the log at path has lost, from its
// current file's head (0 if it was never rotated or does not exist).
func Lost(path string) (int64, error) {
	h, err := readHead(path)
	return h.Lost, err
}

// readHead is the head of the file at path (zero if it has none or does
// not exist).
func readHead(path string) (Head, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Head{}, nil
	}
	if err != nil {
		return Head{}, err
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(f, 4096).ReadSlice('\n')
	if err != nil && len(line) == 0 {
		return Head{}, nil
	}
	h, _ := head(line)
	return h, nil
}
