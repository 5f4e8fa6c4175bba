package confine

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/host/posixacl"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// Grants by object (issue 45): a disk's image and its bases are granted
// through the descriptors they were checked on, and the record keeps the
// object (device, inode, a file handle) with the name, so that taking a
// grant back finds that object again, wherever its name leads by then,
// and a swapped name can never move a grant onto another file.

// grantObject is the object an ACL entry was added to.
type grantObject struct {
	Place  string `json:"place"` // the directory it was opened beneath
	Dev    uint64 `json:"dev"`
	Ino    uint64 `json:"ino"`
	HType  int32  `json:"handle_type,omitempty"` // name_to_handle_at's
	Handle string `json:"handle,omitempty"`      // base64; "" where the file system has none
}

// diskNeeds are the files QEMU opens for f's disks: opened and checked
// through OpenDisk where it can (the needs carry their descriptors; the
// caller closes them, closeNeeds), else by name (block devices, an RBD
// disk's ceph_conf). A disk QEMU gets as descriptors (qemuargs.PassedByFD
// of stateDir: internal/lifecycle/diskfds) is listed for the profile only (AppArmor
// checks a received descriptor against it) and granted nothing.
func (m *Manager) diskNeeds(ctx context.Context, f *spec.File, stateDir string) ([]need, error) {
	var ns []need
	for i, d := range f.VM.Disks {
		field := fmt.Sprintf("%s: disk[%d] %q", f.Path, i, d.Name)
		byFD := m.byFD(d, stateDir)
		if m.OpenDisk != nil {
			o, err := m.OpenDisk(ctx, d)
			if err != nil {
				closeNeeds(ns)
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			if o != nil {
				for _, l := range o.Levels {
					ns = append(ns, need{path: l.Path, mode: l.Mode, field: field, disk: true, file: l.File, place: l.Place, byFD: byFD})
				}
				continue
			}
		}
		files, err := storage.DiskFiles(ctx, d)
		if err != nil {
			closeNeeds(ns)
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		for _, r := range files {
			ns = append(ns, need{path: r.Path, mode: r.Mode, field: field, disk: true, byFD: byFD})
		}
	}
	return ns, nil
}

// byFD reports whether QEMU gets d as descriptors (internal/lifecycle/diskfds).
func (m *Manager) byFD(d spec.Disk, stateDir string) bool {
	return qemuargs.PassedByFD(d, stateDir)
}

// closeNeeds closes the descriptors needs were opened on.
func closeNeeds(ns []need) {
	for _, n := range ns {
		if n.file != nil {
			n.file.Close()
		}
	}
}

// openRule opens a hot-plugged disk's file beneath its place and checks
// the object; nil where the path lies in no place (a block device's
// entry), which is granted by name.
func (m *Manager) openRule(path string) (*os.File, string, error) {
	if m.DiskPlace == nil {
		return nil, "", nil
	}
	place, err := m.DiskPlace(path, true)
	if err != nil {
		return nil, "", nil
	}
	f, err := storage.OpenBeneath(place, path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, "", err
	}
	if _, err := storage.CheckDiskObject(f); err != nil {
		f.Close()
		return nil, "", err
	}
	return f, place, nil
}

// lacks reports whether c's user lacks want on the path (or the object f,
// when given) and its entry there now.
func lacks(path string, f *os.File, c *Record, want uint16) (has bool, prev int, err error) {
	if f == nil {
		if has, err = posixacl.HasAccess(path, c.UID, c.GID, nil, want); err != nil || has {
			return has, 0, err
		}
		prev, err = posixacl.UserEntry(path, c.UID)
		return false, prev, err
	}
	if has, err = posixacl.HasAccessFile(f, c.UID, c.GID, nil, want); err != nil || has {
		return has, 0, err
	}
	prev, err = posixacl.UserEntryFile(f, c.UID)
	return false, prev, err
}

// objectOf is the record of f's object, opened beneath place.
func objectOf(f *os.File, place string) (*grantObject, error) {
	o, err := storage.Stat(f)
	if err != nil {
		return nil, err
	}
	g := &grantObject{Place: place, Dev: o.Dev, Ino: o.Ino}
	h, _, err := unix.NameToHandleAt(int(f.Fd()), "", unix.AT_EMPTY_PATH)
	if err == nil {
		g.HType, g.Handle = h.Type(), base64.StdEncoding.EncodeToString(h.Bytes())
	}
	return g, nil
}

// grantOne adds g's entry: through f when given, else by name.
func grantOne(g aclGrant, f *os.File, c *Record) error {
	var err error
	if f != nil {
		_, err = posixacl.GrantUserFile(f, c.UID, g.Perm)
	} else {
		_, err = posixacl.GrantUser(g.Path, c.UID, g.Perm)
	}
	if err != nil {
		return fmt.Errorf("give %s access to %s: %w", c.User, g.Path, err)
	}
	return nil
}

// revokeObject takes g back from the object it was given to: found by its
// file handle (whatever its names are now), else by its name beneath its
// place if that is still the same object. An object found by neither is
// gone (its last name removed): nothing holds the grant.
func revokeObject(c *Record, g aclGrant) error {
	f, err := findObject(g)
	if err != nil || f == nil {
		return err
	}
	defer f.Close()
	if err := posixacl.RevokeUserFile(f, c.UID, g.Prev); err != nil {
		return fmt.Errorf("take back %s's access to %s: %w", c.User, g.Path, err)
	}
	return nil
}

// findObject opens g's object again; nil, nil when it is not found.
func findObject(g aclGrant) (*os.File, error) {
	o := g.Object
	same := func(f *os.File) bool {
		st, err := storage.Stat(f)
		return err == nil && st.Dev == o.Dev && st.Ino == o.Ino
	}
	if b, err := base64.StdEncoding.DecodeString(o.Handle); err == nil && o.Handle != "" {
		// Not O_PATH: open_by_handle_at wants a real descriptor of the file system.
		if mfd, err := unix.Open(o.Place, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(o.HType, b), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC)
			unix.Close(mfd)
			if errors.Is(err, unix.ESTALE) {
				return nil, nil // removed: no name reaches it, no grant remains
			}
			if err == nil {
				f := os.NewFile(uintptr(fd), g.Path)
				if same(f) {
					return f, nil
				}
				f.Close()
			}
		}
	}
	f, err := storage.OpenBeneath(o.Place, g.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, nil // the name leads elsewhere or nowhere: not the object
	}
	if same(f) {
		return f, nil
	}
	f.Close()
	return nil, nil
}
