package supervisor

import (
	"context"
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// fileLock is an flock(2) lock on an open file. The kernel drops it when the
// holder dies, so a killed vmsup never leaves a VM locked. (gofrs/flock does
// not expose its file, and the holder's name is written into the lock file.)
type fileLock struct {
	f      *os.File
	holder bool // setHolder wrote into the file: unlock empties it
}

// lockFile takes an exclusive lock on path (created 0600). With wait, it
// polls until ctx ends; without, it tries once. ok is false when held.
func lockFile(ctx context.Context, path string, wait bool) (l *fileLock, ok bool, err error) {
	// O_NOFOLLOW: some lock files sit where the QEMU user can write; a
	// symlink planted there must not lead root to open another file.
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, false, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &fileLock{f: f}, true, nil
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

// setHolder records who holds the lock, for BusyError.
func (l *fileLock) setHolder(s string) {
	l.holder = true
	_ = l.f.Truncate(0)
	_, _ = l.f.WriteAt([]byte(s), 0)
}

func (l *fileLock) unlock() {
	if l.holder {
		_ = l.f.Truncate(0)
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	l.f.Close()
}
