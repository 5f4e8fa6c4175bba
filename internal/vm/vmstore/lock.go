package vmstore

import (
	"context"
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// FileLock is an flock(2) lock on an open file. The kernel drops it when the
// holder dies, so a killed vmsup never leaves a VM locked. (gofrs/flock does
// not expose its file, and the holder's name is written into the lock file.)
type FileLock struct {
	f      *os.File
	path   string
	holder bool // setHolder wrote into the file: unlock empties it
	// drop says, at unlock, whether the lock file can go (its VM is gone):
	// unlinking it while held is safe because a locker checks that the
	// file it locked is still the one at path.
	drop func() bool
	// borrowed: held by the caller's caller (Borrowed).
	borrowed bool
}

// LockFile takes an exclusive lock on path (created 0600). With wait, it
// polls until ctx ends; without, it tries once. ok is false when held.
func LockFile(ctx context.Context, path string, wait bool) (l *FileLock, ok bool, err error) {
	for {
		l, ok, err = lockFile(ctx, path, wait)
		if err != nil || !ok || l.current() {
			return l, ok, err
		}
		// Its holder removed the file before letting go: lock the new one.
		l.Unlock()
	}
}

func lockFile(ctx context.Context, path string, wait bool) (l *FileLock, ok bool, err error) {
	// O_NOFOLLOW: some lock files sit where the QEMU user can write; a
	// symlink planted there must not lead root to open another file.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if errors.Is(err, unix.EROFS) {
		// A reader with a read-only view of the state root (the metrics
		// collector): flock needs no write access, and the file is there
		// if anything runs to take turns with.
		f, err = os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	}
	if err != nil {
		return nil, false, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &FileLock{f: f, path: path}, true, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, false, err
		}
		if !wait {
			f.Close()
			return nil, false, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, false, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SetHolder records who holds the lock, for BusyError.
func (l *FileLock) SetHolder(s string) {
	l.holder = true
	_ = l.f.Truncate(0)
	_, _ = l.f.WriteAt([]byte(s), 0)
}

// current reports whether the locked file is still the one at its path.
func (l *FileLock) current() bool {
	var a, b unix.Stat_t
	if unix.Fstat(int(l.f.Fd()), &a) != nil || unix.Lstat(l.path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// Borrowed is a lock held by the caller's caller: its Unlock does nothing
// (the holder unlocks).
func Borrowed() *FileLock { return &FileLock{borrowed: true} }

func (l *FileLock) Unlock() {
	if l.borrowed {
		return
	}
	if l.drop != nil && l.drop() {
		os.Remove(l.path)
	} else if l.holder {
		_ = l.f.Truncate(0)
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	l.f.Close()
}
