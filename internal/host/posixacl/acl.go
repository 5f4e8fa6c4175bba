// Package posixacl reads and writes POSIX access ACLs as the
// system.posix_acl_access xattr (no libacl or setfacl needed). vmsup gives
// the QEMU user access to a file it names by adding one named-user entry and
// takes exactly that entry back on down: owners and modes of the user's
// files are never changed.
package posixacl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	aclXattr   = "system.posix_acl_access"
	aclVersion = 2

	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
)

type aclEntry struct {
	Tag, Perm uint16
	ID        uint32
}

// target is the file an ACL is read from and written to: by name, or
// through an open descriptor (the object vmsup checked, whatever its name
// leads to by now).
type target struct {
	path string
	f    *os.File
}

func (t target) name() string {
	if t.f != nil {
		return t.f.Name()
	}
	return t.path
}

func (t target) stat() (os.FileInfo, error) {
	if t.f != nil {
		return t.f.Stat()
	}
	return os.Stat(t.path)
}

func (t target) getxattr(buf []byte) (int, error) {
	if t.f != nil {
		return unix.Fgetxattr(int(t.f.Fd()), aclXattr, buf)
	}
	return unix.Getxattr(t.path, aclXattr, buf)
}

func (t target) setxattr(buf []byte) error {
	if t.f != nil {
		return unix.Fsetxattr(int(t.f.Fd()), aclXattr, buf, 0)
	}
	return unix.Setxattr(t.path, aclXattr, buf, 0)
}

func (t target) removexattr() error {
	if t.f != nil {
		return unix.Fremovexattr(int(t.f.Fd()), aclXattr)
	}
	return unix.Removexattr(t.path, aclXattr)
}

func (t target) chmod(m os.FileMode) error {
	if t.f != nil {
		return t.f.Chmod(m)
	}
	return os.Chmod(t.path, m)
}

// readACL returns the file's access ACL, or the three entries equivalent to
// its mode when it has none.
func readACL(t target) ([]aclEntry, os.FileInfo, error) {
	path := t.name()
	fi, err := t.stat()
	if err != nil {
		return nil, nil, err
	}
	buf := make([]byte, 4096)
	n, err := t.getxattr(buf)
	if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP) {
		m := uint16(fi.Mode().Perm())
		return []aclEntry{{aclUserObj, m >> 6 & 7, 0}, {aclGroupObj, m >> 3 & 7, 0}, {aclOther, m & 7, 0}}, fi, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read ACL of %s: %w", path, err)
	}
	buf = buf[:n]
	if len(buf) < 4 || binary.LittleEndian.Uint32(buf) != aclVersion || (len(buf)-4)%8 != 0 {
		return nil, nil, fmt.Errorf("read ACL of %s: unknown format", path)
	}
	var es []aclEntry
	for b := buf[4:]; len(b) >= 8; b = b[8:] {
		es = append(es, aclEntry{binary.LittleEndian.Uint16(b), binary.LittleEndian.Uint16(b[2:]), binary.LittleEndian.Uint32(b[4:])})
	}
	return es, fi, nil
}

// writeACL stores es (recomputing the mask), or removes the ACL when only
// the three mode entries are left.
func writeACL(t target, es []aclEntry) error {
	path := t.name()
	var mask uint16
	named := false
	var kept []aclEntry
	for _, e := range es {
		switch e.Tag {
		case aclMask:
			continue
		case aclUser, aclGroup:
			named = true
			mask |= e.Perm
		case aclGroupObj:
			mask |= e.Perm
		}
		kept = append(kept, e)
	}
	if !named {
		if err := t.removexattr(); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove ACL of %s: %w", path, err)
		}
		// The mode's group bits showed the mask; give them back the group's own.
		fi, err := t.stat()
		if err != nil {
			return err
		}
		m := fi.Mode().Perm() &^ 0o070
		for _, e := range kept {
			if e.Tag == aclGroupObj {
				m |= os.FileMode(e.Perm) << 3
			}
		}
		return t.chmod(m | fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky))
	}
	kept = append(kept, aclEntry{aclMask, mask, 0})
	// The kernel wants entries ordered by tag, then id.
	for i := 1; i < len(kept); i++ {
		for j := i; j > 0 && (kept[j].Tag < kept[j-1].Tag || kept[j].Tag == kept[j-1].Tag && kept[j].ID < kept[j-1].ID); j-- {
			kept[j], kept[j-1] = kept[j-1], kept[j]
		}
	}
	buf := make([]byte, 4+8*len(kept))
	binary.LittleEndian.PutUint32(buf, aclVersion)
	for i, e := range kept {
		b := buf[4+8*i:]
		binary.LittleEndian.PutUint16(b, e.Tag)
		binary.LittleEndian.PutUint16(b[2:], e.Perm)
		id := e.ID
		if e.Tag != aclUser && e.Tag != aclGroup {
			id = 0xffffffff // ACL_UNDEFINED_ID
		}
		binary.LittleEndian.PutUint32(b[4:], id)
	}
	if err := t.setxattr(buf); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("%s: its filesystem has no POSIX ACLs: %w", path, err)
		}
		return fmt.Errorf("set ACL of %s: %w", path, err)
	}
	return nil
}

// HasAccess reports whether uid (primary group gid, supplementary groups
// groups) has every permission bit in want (4 r, 2 w, 1 x) on path, by the
// kernel's ACL algorithm.
func HasAccess(path string, uid, gid uint32, groups []uint32, want uint16) (bool, error) {
	return hasAccess(target{path: path}, uid, gid, groups, want)
}

// HasAccessFile is HasAccess on the object f is open on.
func HasAccessFile(f *os.File, uid, gid uint32, groups []uint32, want uint16) (bool, error) {
	return hasAccess(target{f: f}, uid, gid, groups, want)
}

func hasAccess(t target, uid, gid uint32, groups []uint32, want uint16) (bool, error) {
	es, fi, err := readACL(t)
	if err != nil {
		return false, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	mask := uint16(7)
	for _, e := range es {
		if e.Tag == aclMask {
			mask = e.Perm
		}
	}
	inGroup := func(g uint32) bool {
		if g == gid {
			return true
		}
		for _, x := range groups {
			if x == g {
				return true
			}
		}
		return false
	}
	if st.Uid == uid {
		for _, e := range es {
			if e.Tag == aclUserObj {
				return e.Perm&want == want, nil
			}
		}
	}
	for _, e := range es {
		if e.Tag == aclUser && e.ID == uid {
			return e.Perm&mask&want == want, nil
		}
	}
	matched, granted := false, uint16(0)
	for _, e := range es {
		if e.Tag == aclGroupObj && inGroup(st.Gid) || e.Tag == aclGroup && inGroup(e.ID) {
			matched = true
			granted |= e.Perm & mask
		}
	}
	if matched {
		return granted&want == want, nil
	}
	for _, e := range es {
		if e.Tag == aclOther {
			return e.Perm&want == want, nil
		}
	}
	return false, nil
}

// GrantUser adds want to uid's named entry on path and returns that entry's
// previous permissions (-1: there was none), for RevokeUser.
func GrantUser(path string, uid uint32, want uint16) (int, error) {
	return grantUser(target{path: path}, uid, want)
}

// GrantUserFile is GrantUser on the object f is open on (fsetxattr): a
// name swapped since f was opened cannot move the grant.
func GrantUserFile(f *os.File, uid uint32, want uint16) (int, error) {
	return grantUser(target{f: f}, uid, want)
}

func grantUser(t target, uid uint32, want uint16) (int, error) {
	es, _, err := readACL(t)
	if err != nil {
		return 0, err
	}
	for i, e := range es {
		if e.Tag == aclUser && e.ID == uid {
			es[i].Perm |= want
			return int(e.Perm), writeACL(t, es)
		}
	}
	return -1, writeACL(t, append(es, aclEntry{aclUser, want, uid}))
}

// RevokeUser restores uid's named entry on path to prev (-1 removes it).
func RevokeUser(path string, uid uint32, prev int) error {
	return revokeUser(target{path: path}, uid, prev)
}

// RevokeUserFile is RevokeUser on the object f is open on.
func RevokeUserFile(f *os.File, uid uint32, prev int) error {
	return revokeUser(target{f: f}, uid, prev)
}

func revokeUser(t target, uid uint32, prev int) error {
	es, _, err := readACL(t)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var out []aclEntry
	for _, e := range es {
		if e.Tag == aclUser && e.ID == uid {
			if prev < 0 {
				continue
			}
			e.Perm = uint16(prev)
		}
		out = append(out, e)
	}
	return writeACL(t, out)
}

// UserEntry returns uid's named entry's permissions on path (-1: none), the
// value RevokeUser restores.
func UserEntry(path string, uid uint32) (int, error) {
	return userEntry(target{path: path}, uid)
}

// UserEntryFile is UserEntry on the object f is open on.
func UserEntryFile(f *os.File, uid uint32) (int, error) {
	return userEntry(target{f: f}, uid)
}

func userEntry(t target, uid uint32) (int, error) {
	es, _, err := readACL(t)
	if err != nil {
		return 0, err
	}
	for _, e := range es {
		if e.Tag == aclUser && e.ID == uid {
			return int(e.Perm), nil
		}
	}
	return -1, nil
}
