package vmstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// View is one VM as it runs now (or, shut off, as it last ran and will boot
// next): the one place every command reads what a VM is. It joins the
// record (the spec QEMU realizes, with apply's edits), the live resizes,
// the disks moved, the snapshot tree's overlays, the devices attached by
// hand and the pending change, so no command rebuilds that view from the
// VM's file or from a part of the records.
type View struct {
	Name string
	// Owner is the file the VM belongs to (absolute): the one it was
	// started or adopted from; "" when none is known.
	Owner   string
	Applied *Applied
	// Booted is the spec QEMU realizes: what it booted with plus what
	// apply plugged or unplugged since, with defaults filled; disks and
	// NICs as the VM's file names them.
	Booted *spec.VM
	// Spec is Booted with the live resizes (vmsup set): the vCPUs and
	// memory the guest has now. Plan compares the file with it.
	Spec *spec.VM
	// Disks are every disk QEMU opens: the file's in file order (moved
	// ones where they are now), then those attached by hand.
	Disks []Disk
	// NICs are the file's, then those attached by hand.
	NICs []NIC
	// Tree is the VM's snapshot tree (empty when it has none).
	Tree    *snapshottree.Tree
	Pending *Pending
	// Running: QEMU's monitor socket exists (a QEMU runs the VM, or one
	// died without removing it: systemd has the last word on that).
	Running bool
}

// Disk is one disk as QEMU opens it.
type Disk struct {
	// Disk is the spec QEMU runs the disk with: a moved disk's new place,
	// an attached disk as attached.
	spec.Disk
	// Active is the image QEMU writes for a file disk: a snapshot's
	// overlay when the tree put one on the disk, else the disk's own file.
	// Zero for the other types.
	Active snapshottree.Image
	// Attached: plugged with vmsup disk attach, outside the VM's file;
	// Bus and FDSet are its root port and fd set (AttachedDisk).
	Attached bool
	Bus      string
	FDSet    *int64
	// MovedFrom is the source the VM's file names for a disk that vmsup
	// disk move put elsewhere ("" when it was not moved).
	MovedFrom string
}

// NIC is one NIC of the VM; Attached: plugged with vmsup nic attach.
type NIC struct {
	spec.NIC
	Attached bool
}

// ErrNoRecord means vmsup has no record of the VM (never started here, or
// removed).
var ErrNoRecord = errors.New("no record of the VM")

// View reads the VM's view from its records. A VM without a record gives
// ErrNoRecord.
func (s Store) View(name string) (*View, error) {
	app, err := s.ReadApplied(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoRecord
	}
	if err != nil {
		return nil, err
	}
	return s.viewOf(app)
}

func (s Store) viewOf(app *Applied) (*View, error) {
	p := s.Paths(app.Name)
	v := &View{Name: app.Name, Owner: app.SourceFile, Applied: app}
	var err error
	if v.Booted, err = app.VM(); err != nil {
		return nil, err
	}
	if v.Spec, err = app.Running(); err != nil {
		return nil, err
	}
	if v.Tree, err = snapshottree.Load(p.Snapshots()); err != nil {
		return nil, vmerr.Wrap(app.Name, err)
	}
	if v.Pending, err = s.ReadPending(app.Name); err != nil {
		return nil, err
	}
	v.Disks = OpenedDisks(v.Booted.Disks, app, v.Tree)
	for _, n := range v.Booted.NICs {
		v.NICs = append(v.NICs, NIC{NIC: n})
	}
	for _, n := range app.AttachedNICs {
		v.NICs = append(v.NICs, NIC{NIC: n, Attached: true})
	}
	_, serr := os.Stat(p.QMP)
	v.Running = serr == nil
	return v, nil
}

// OpenedDisks are the disks QEMU opens for the file's disks (moved ones
// where they are now, as app records), then the disks attached by hand,
// each on its active image in tree. app and tree may be nil (a VM never
// started: the file's disks as they are).
func OpenedDisks(disks []spec.Disk, app *Applied, tree *snapshottree.Tree) []Disk {
	var moved map[string]MovedDisk
	if app != nil {
		moved = app.Moved
	}
	out := make([]Disk, 0, len(disks))
	for _, d := range disks {
		od := Disk{Disk: d}
		if mv, ok := moved[d.Name]; ok && mv.From == DiskSource(d) {
			od.Disk, od.MovedFrom = mv.Disk, mv.From
		}
		out = append(out, od)
	}
	if app != nil {
		for _, a := range app.Attached {
			out = append(out, Disk{Disk: a.Disk, Attached: true, Bus: a.Bus, FDSet: a.FDSet})
		}
	}
	for i := range out {
		if out[i].Type != spec.DiskFile {
			continue
		}
		own := snapshottree.Image{Path: out[i].File, Format: out[i].Format}
		if tree != nil {
			own = tree.ActiveImage(out[i].Name, own)
		}
		out[i].Active = own
	}
	return out
}

// DiskSource says where a disk's data lives, in one string: the image or
// device path, iscsi://PORTAL/TARGET/LUN or rbd:POOL/IMAGE.
func DiskSource(d spec.Disk) string {
	switch d.Type {
	case spec.DiskISCSI:
		return fmt.Sprintf("iscsi://%s/%s/%d", d.Portal, d.Target, d.LUN)
	case spec.DiskRBD:
		return "rbd:" + d.Pool + "/" + d.Image
	case spec.DiskSeed:
		return "cloud-init seed (built by vmsup)"
	}
	return d.File
}

// Disk returns the VM's disk called name, or nil.
func (v *View) Disk(name string) *Disk {
	i := slices.IndexFunc(v.Disks, func(d Disk) bool { return d.Name == name })
	if i < 0 {
		return nil
	}
	return &v.Disks[i]
}

// NIC returns the VM's NIC called name, or nil.
func (v *View) NIC(name string) *NIC {
	i := slices.IndexFunc(v.NICs, func(n NIC) bool { return n.Name == name })
	if i < 0 {
		return nil
	}
	return &v.NICs[i]
}

// Writable are the disks whose data the guest writes: not CD-ROMs, not
// read-only, not seeds.
func (v *View) Writable() []Disk {
	return slices.DeleteFunc(slices.Clone(v.Disks), func(d Disk) bool {
		return d.IsCDROM() || d.ReadOnly || d.Type == spec.DiskSeed
	})
}

// Images are the host files QEMU holds open for the VM's disks: each file
// disk's active image and the images under it (the snapshot tree's chain
// down to the disk's own file and its backing file), and the block devices.
// Paths as recorded (absolute).
func (v *View) Images() []string {
	var out []string
	for _, d := range v.Disks {
		out = append(out, d.Images(v.Tree)...)
	}
	return out
}

// Images are the host files the disk's QEMU nodes open: for a file disk the
// active image and every image below it that vmsup knows of; for a block
// device its path.
func (d Disk) Images(tree *snapshottree.Tree) []string {
	switch d.Type {
	case spec.DiskBlock:
		return []string{d.File}
	case spec.DiskFile:
	default:
		return nil
	}
	var out []string
	im := d.Active
	for range 256 { // a chain longer than this is not the tree's
		if im.Path == "" || slices.Contains(out, im.Path) {
			break
		}
		out = append(out, im.Path)
		if im.Backing == "" {
			break
		}
		im = imageIn(tree, im.Backing)
	}
	if !slices.Contains(out, d.File) && d.File != "" {
		out = append(out, d.File)
	}
	if d.Backing != "" && !slices.Contains(out, d.Backing) {
		out = append(out, d.Backing)
	}
	return out
}

// imageIn finds the image at path in the tree (an overlay it made), else a
// bare image of that path.
func imageIn(tree *snapshottree.Tree, path string) snapshottree.Image {
	if tree != nil {
		if im, ok := tree.Image(path); ok {
			return im
		}
	}
	return snapshottree.Image{Path: filepath.Clean(path)}
}

// Opened is the disk's spec as QEMU opens it at boot: on its active image
// when a snapshot put it on an overlay (the overlay has its chain in its
// header, and exists: nothing to create).
func (d Disk) Opened() spec.Disk {
	o := d.Disk
	if d.Type == spec.DiskFile && d.Active.Path != "" && d.Active.Path != d.File {
		o.File, o.Format, o.Backing, o.Size = d.Active.Path, d.Active.Format, "", 0
	}
	return o
}
