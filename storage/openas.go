package storage

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cred is a file-system identity an open runs as: another process's
// (QEMU's) fs uid, fs gid and supplementary groups.
type Cred struct {
	UID, GID uint32
	Groups   []uint32
}

// OpenBeneathAs is OpenBeneath with the name resolved and the file opened
// with cred's permissions: root vmsup opening a file for QEMU must not
// give it one its own user could not open. The directory itself is opened
// as the caller. The open runs on a thread of its own whose fs identity
// is changed for it and given back after (or, if that fails, the thread
// is never handed back to the runtime).
func OpenBeneathAs(dir, name string, flags int, cred Cred) (*os.File, error) {
	return openBeneath(dir, name, func(dfd int, rel string) (int, error) {
		type result struct {
			fd  int
			err error
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			restore, err := becomeFS(cred)
			if err == nil {
				fd, oerr := openat2Beneath(dfd, rel, flags)
				done <- result{fd, oerr}
			} else {
				done <- result{-1, err}
			}
			// A thread whose identity could not be given back ends with this
			// goroutine (the main thread is parked for good instead).
			if restore != nil && restore() == nil {
				runtime.UnlockOSThread()
			}
		}()
		r := <-done
		return r.fd, r.err
	})
}

// becomeFS gives the calling thread cred's groups, fs gid and fs uid (the
// last drops the capabilities that override file permissions), checks
// they took, and returns how to give the thread its own back (nil if
// nothing was changed).
func becomeFS(cred Cred) (func() error, error) {
	oldGroups, err := unix.Getgroups()
	if err != nil {
		return nil, fmt.Errorf("getgroups: %w", err)
	}
	oldUID, _ := unix.SetfsuidRetUid(-1)
	oldGID, _ := unix.SetfsgidRetGid(-1)
	restore := func() error {
		unix.SetfsuidRetUid(oldUID)
		unix.SetfsgidRetGid(oldGID)
		if err := unix.Setgroups(oldGroups); err != nil {
			return err
		}
		if u, g := fsIDs(); u != oldUID || g != oldGID {
			return fmt.Errorf("the thread kept fs uid %d, fs gid %d", u, g)
		}
		return nil
	}
	groups := make([]int, len(cred.Groups))
	for i, g := range cred.Groups {
		groups[i] = int(g)
	}
	if err := unix.Setgroups(groups); err != nil {
		return restore, fmt.Errorf("setgroups: %w", err)
	}
	unix.SetfsgidRetGid(int(cred.GID))
	unix.SetfsuidRetUid(int(cred.UID))
	// setfsuid and setfsgid fail silently: read back what the thread has.
	if u, g := fsIDs(); u != int(cred.UID) || g != int(cred.GID) {
		return restore, fmt.Errorf("take fs uid %d, fs gid %d: the thread has %d, %d", cred.UID, cred.GID, u, g)
	}
	return restore, nil
}

// fsIDs are the calling thread's fs uid and fs gid.
func fsIDs() (int, int) {
	u, _ := unix.SetfsuidRetUid(-1)
	g, _ := unix.SetfsgidRetGid(-1)
	return u, g
}

// ProcCred reads process pid's fs uid, fs gid and groups from
// /proc/PID/status.
func ProcCred(pid int) (Cred, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return Cred{}, err
	}
	var c Cred
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		key, rest, _ := strings.Cut(line, ":")
		if key != "Uid" && key != "Gid" && key != "Groups" {
			continue
		}
		f := strings.Fields(rest)
		ids := make([]uint32, len(f))
		for i, s := range f {
			n, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				return Cred{}, fmt.Errorf("%s: %s: %q: %w", path, key, s, err)
			}
			ids[i] = uint32(n)
		}
		switch {
		case key == "Uid" && len(ids) == 4: // real, effective, saved, fs
			c.UID, found = ids[3], found|1
		case key == "Gid" && len(ids) == 4:
			c.GID, found = ids[3], found|2
		case key == "Groups":
			c.Groups, found = ids, found|4
		}
	}
	if found != 7 {
		return Cred{}, fmt.Errorf("%s: no Uid, Gid or Groups line", path)
	}
	return c, nil
}
