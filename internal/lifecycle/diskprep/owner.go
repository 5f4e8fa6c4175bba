package diskprep

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// An image belongs to the VM whose disk writes it: the disk's file and the
// overlays its snapshots put on it (the view's chain), as long as vmsup
// keeps the VM's record, running or shut off. Another VM may open it, as
// its disk or a base, only when the owner's disk says shared = true (or
// it is a clone started from a snapshot frozen in it): a VM file names
// any path in the image places, and without this rule an operator allowed
// one VM could boot (and be granted) another's disk.

// ErrOwned is what an OwnedError wraps, for callers that branch on a
// refusal (the remote API audits it as refused).
var ErrOwned = errors.New("the image belongs to another VM")

// OwnedError says a disk of VM names an image another VM owns.
type OwnedError struct {
	VM, Disk  string // the VM refused and its disk
	Path      string // the image as the disk leads to it
	Owner     string // the VM the image belongs to
	OwnerDisk string // its disk
	Base      bool   // the disk would open it as a base (backing)
}

func (e *OwnedError) Error() string {
	how := ""
	if e.Base {
		how = " (as its base image)"
	}
	return fmt.Sprintf("disk %q: %s%s belongs to VM %q (its disk %q), not to VM %q: "+
		"a VM opens another VM's image only when that disk has shared = true", e.Disk, e.Path, how, e.Owner, e.OwnerDisk, e.VM)
}

func (e *OwnedError) Unwrap() error { return ErrOwned }

// owned is one image another VM owns.
type owned struct {
	vm, disk string
	clones   []string // VMs that may stand on it: clones of a snapshot frozen in it
}

// ownedImages are the images the VMs vmsup knows (but self) own, by
// storage.ImageID; images that do not exist are left out (nothing to take).
func (m Manager) ownedImages(self string) map[string]owned {
	out := map[string]owned{}
	names, _ := m.Store.Known()
	for _, n := range names {
		if n == self {
			continue
		}
		v, err := m.Store.View(n)
		if err != nil {
			continue // no record (removed), or one vmsup cannot read: it owns nothing it can show
		}
		for _, d := range v.Writable() {
			if d.Shared {
				continue
			}
			for _, p := range d.Images(v.Tree) {
				if p == d.Backing {
					continue // a base the disk names: the user's, not the VM's
				}
				if _, err := os.Stat(p); err != nil {
					continue
				}
				out[storage.ImageID(p)] = owned{vm: n, disk: d.Name, clones: clonesOn(v, p)}
			}
		}
	}
	return out
}

// clonesOn are the VMs cloned from a snapshot of v frozen in image p.
func clonesOn(v *vmstore.View, p string) []string {
	var out []string
	for _, s := range v.Tree.Snapshots {
		for _, im := range s.Disks {
			if im.Path == p {
				out = append(out, s.Clones...)
			}
		}
	}
	return out
}

// checkOwners refuses each use of uses (IDs as storage.ImageID makes them)
// of an image another VM owns.
func (m Manager) checkOwners(f *spec.File, disks []spec.Disk, uses []spec.ImageUse) []error {
	var errs []error
	var own map[string]owned
	for _, u := range uses {
		if u.Key != "file" && u.Key != "backing" {
			continue // a LUN or an RBD image: the storage's own access control
		}
		if own == nil {
			own = m.ownedImages(f.VM.Name)
		}
		o, ok := own[u.ID]
		if !ok || u.Base && slices.Contains(o.clones, f.VM.Name) {
			continue
		}
		errs = append(errs, f.Errorf(fmt.Sprintf("disk[%d].%s", u.Disk, u.Key), "%v", &OwnedError{VM: f.VM.Name,
			Disk: disks[u.Disk].Name, Path: u.Path, Owner: o.vm, OwnerDisk: o.disk, Base: u.Base}))
	}
	return errs
}

// hostUses are the host images the disks that passed their checks (ok)
// open, by storage.ImageID: each disk's image and named base, and the
// bases in an existing qcow2's own backing chain.
func hostUses(ctx context.Context, disks []spec.Disk, ok map[int]bool) []spec.ImageUse {
	var all []spec.ImageUse
	for _, u := range spec.ImageUses(disks) {
		if !ok[u.Disk] {
			continue
		}
		if u.Key == "file" || u.Key == "backing" { // a LUN's or RBD image's ID is its address
			u.ID = storage.ImageID(u.Path)
		}
		all = append(all, u)
		d := disks[u.Disk]
		if u.Key != "file" || d.Type != spec.DiskFile || d.Format != spec.FormatQcow2 {
			continue
		}
		if _, err := os.Stat(d.File); err != nil {
			continue // created at start, on its backing (a use of its own)
		}
		files, err := storage.DiskFiles(ctx, d) // the image and its bases
		if err != nil {
			continue // its own check read the chain: nothing to add
		}
		for _, b := range files[1:] {
			all = append(all, spec.ImageUse{Disk: u.Disk, Key: "file", Path: b.Path, ID: storage.ImageID(b.Path), Base: true})
		}
	}
	return all
}
