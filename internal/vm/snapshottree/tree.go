// Package snapshot keeps a VM's snapshot tree: which image each disk runs
// on now, and for each snapshot the image each disk was frozen in and the
// file holding the guest's memory. Snapshots are external: taking one
// freezes the image a disk runs on and puts a new qcow2 overlay on top of
// it, so a snapshot's images are never written again while it exists.
//
// The tree is plain data with pure planning functions (what a revert or a
// removal must do); the supervisor does the I/O and records the result.
package snapshottree

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// Image is a disk image the tree manages or points to.
type Image struct {
	Path   string `json:"path"`
	Format string `json:"format"` // "qcow2" or "raw"
	// Backing is the image this overlay was created on; "" for a disk's
	// own file (whatever chain it has is the user's).
	Backing       string `json:"backing,omitempty"`
	BackingFormat string `json:"backing_format,omitempty"`
}

// Snapshot is one point in time of the VM.
type Snapshot struct {
	Tag     string    `json:"tag"`
	Parent  string    `json:"parent,omitempty"` // the snapshot the VM ran from when this one was taken
	Created time.Time `json:"created"`
	// Disks are the images each snapshotted disk was frozen in.
	Disks map[string]Image `json:"disks"`
	// Memory is the file with the guest's RAM and device state (a
	// migration stream), "" for a disk-only snapshot.
	Memory string `json:"memory,omitempty"`
	// Running: the guest ran at the snapshot (a memory revert resumes it).
	Running bool `json:"running,omitempty"`
	// Devices identifies the device set a memory state belongs to: a
	// revert with memory needs the VM to boot with the same devices.
	Devices string `json:"devices,omitempty"`
	// Machine is the versioned machine type the memory state was saved
	// with (the VM's pinned one): QEMU loads it into that type only.
	Machine string `json:"machine,omitempty"`
	// Quiesced says how the guest's filesystems were made consistent:
	// "fsfreeze (N filesystems)", "paused (memory)", or why not.
	Quiesced string `json:"quiesced,omitempty"`
	// RBD are the snapshots of the VM's RBD disks (disk -> the RBD snapshot's
	// name in the disk's image): Ceph keeps them, no overlay is made.
	RBD map[string]string `json:"rbd,omitempty"`
	// Clones are the VMs started from this (memory) snapshot: they stand
	// on its images, which must stay as they are while they exist.
	Clones []string `json:"clones,omitempty"`
}

// Tree is a VM's snapshots and the images its disks run on.
type Tree struct {
	// Name is the VM's, set when the tree is read for a caller (vmsup
	// snapshot ls, the remote API); the file need not hold it.
	Name      string     `json:"name"`
	Snapshots []Snapshot `json:"snapshots,omitempty"`
	// Active is the image each disk runs on when it is not the disk's own
	// file (a snapshot or a revert put an overlay on it).
	Active map[string]Image `json:"active,omitempty"`
	// Current is the snapshot the VM's state grew from ("" before any).
	Current string `json:"current,omitempty"`
}

// Load reads the tree at path; a missing file is an empty tree.
func Load(path string) (*Tree, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &Tree{}, nil
	}
	if err != nil {
		return nil, err
	}
	var t Tree
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &t, nil
}

// Save replaces the tree at path atomically (root only); an empty tree
// removes the file.
func (t *Tree) Save(path string) error {
	return t.SaveWith(path, func(path string, b []byte) error { return atomicfile.WriteFile(path, b, 0o600) })
}

// SaveWith is Save writing through write (which replaces path with b
// atomically: the caller's record writer, with its reserve for a full
// filesystem).
func (t *Tree) SaveWith(path string, write func(path string, b []byte) error) error {
	if len(t.Snapshots) == 0 && len(t.Active) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return write(path, append(b, '\n'))
}

// Empty reports whether the VM has no snapshot and runs on its own files.
func (t *Tree) Empty() bool { return len(t.Snapshots) == 0 && len(t.Active) == 0 }

// Find returns the snapshot tagged tag, or nil.
func (t *Tree) Find(tag string) *Snapshot {
	for i := range t.Snapshots {
		if t.Snapshots[i].Tag == tag {
			return &t.Snapshots[i]
		}
	}
	return nil
}

// ActiveImage is the image disk runs on: the tree's, or own (its file).
func (t *Tree) ActiveImage(disk string, own Image) Image {
	if im, ok := t.Active[disk]; ok {
		return im
	}
	return own
}

// HasDisk reports whether disk runs on an overlay or is in a snapshot.
func (t *Tree) HasDisk(disk string) bool {
	if _, ok := t.Active[disk]; ok {
		return true
	}
	for _, s := range t.Snapshots {
		if _, ok := s.Disks[disk]; ok {
			return true
		}
		if _, ok := s.RBD[disk]; ok {
			return true
		}
	}
	return false
}

// RBDSnapName is the name of snapshot tag in an RBD image.
func RBDSnapName(tag string) string { return "vmsup-" + tag }

// ValidTag checks a snapshot tag: a short name usable in a file name.
func ValidTag(tag string) error {
	if tag == "" || len(tag) > 48 {
		return errors.New("a snapshot tag is 1 to 48 characters")
	}
	for _, r := range tag {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.", r)
		if !ok {
			return fmt.Errorf("snapshot tag %q: only letters, digits, '-', '_' and '.'", tag)
		}
	}
	if tag[0] == '.' || tag[0] == '-' {
		return fmt.Errorf("snapshot tag %q must start with a letter, digit or '_'", tag)
	}
	return nil
}

// OverlayPath names a new overlay for a disk whose own file is file, in
// dir: "<stem>@<tag>.qcow2", with ".N" added when that exists (a second
// revert to the same snapshot). exists reports whether a path is taken.
func OverlayPath(dir, file, tag string, exists func(string) bool) string {
	stem := strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	for n := 0; ; n++ {
		name := fmt.Sprintf("%s@%s.qcow2", stem, tag)
		if n > 0 {
			name = fmt.Sprintf("%s@%s.%d.qcow2", stem, tag, n)
		}
		p := filepath.Join(dir, name)
		if !exists(p) {
			return p
		}
	}
}

// Image returns the image at path that the tree knows: a disk's active
// image or a snapshot's.
func (t *Tree) Image(path string) (Image, bool) {
	for _, im := range t.Active {
		if im.Path == path {
			return im, true
		}
	}
	for _, s := range t.Snapshots {
		for _, im := range s.Disks {
			if im.Path == path {
				return im, true
			}
		}
	}
	return Image{}, false
}

// Used reports whether path is an image of a snapshot or a disk's active
// image: one that must not be deleted.
func (t *Tree) Used(path string) bool {
	_, ok := t.Image(path)
	return ok
}

// Files lists every image and memory file the tree made (not the disks'
// own files), sorted: what removing the VM leaves on disk.
func (t *Tree) Files() []string {
	seen := map[string]bool{}
	add := func(im Image) {
		if im.Backing != "" { // an overlay the tree made
			seen[im.Path] = true
		}
	}
	for _, im := range t.Active {
		add(im)
	}
	for _, s := range t.Snapshots {
		for _, im := range s.Disks {
			add(im)
		}
		if s.Memory != "" {
			seen[s.Memory] = true
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
