package storage

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// QEMU's file-posix driver announces its permissions on an image with open
// file description locks on single bytes: byte 100+n while it holds
// permission bit n, byte 200+n while it does not let others have it.
// Permission bit 1 is "write". (block/file-posix.c: RAW_LOCK_PERM_BASE,
// RAW_LOCK_SHARED_BASE; BLK_PERM_WRITE = 1 << 1.)
const (
	lockPermBase   = 100
	lockSharedBase = 200
	permWriteBit   = 1
)

// WriteLocked reports whether another process holds QEMU's image lock in a
// way that stops a new writer: it writes the image itself, or it does not
// let anybody else write (a running VM with the disk, a qemu-img
// convert...). The check only asks the kernel (F_OFD_GETLK); it takes no
// lock. It works for every format, since the locks sit on the file itself.
func WriteLocked(path string) (bool, error) {
	return heldByte(path, lockPermBase+permWriteBit, lockSharedBase+permWriteBit)
}

// BeingWritten reports whether another process holds the image with
// permission to write it: what a reader that wants a consistent image
// (qemu-img info without -U) cannot share. A reader that only refuses
// writers does not count.
func BeingWritten(path string) (bool, error) {
	return heldByte(path, lockPermBase+permWriteBit)
}

// heldByte reports whether another open file description locks any of the
// bytes of path.
func heldByte(path string, bytes ...int64) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, b := range bytes {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: b, Len: 1}
		if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
			return false, fmt.Errorf("lock check on %s: %w", path, err)
		}
		if lk.Type != unix.F_UNLCK {
			return true, nil
		}
	}
	return false, nil
}
