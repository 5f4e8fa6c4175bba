package spec

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// ImageUse is one host image a disk opens: its image file or block
// device, or a base image below it.
type ImageUse struct {
	Disk  int    // the disk's index
	Key   string // the disk's key that leads to the image: "file" or "backing"
	Path  string // the image as the disk names it
	ID    string // what the image is, to compare: a clean path here, the host's file or device (the supervisor)
	Write bool   // the disk writes the image
	Base  bool   // the image is a base (backing file) of the disk's image
}

// ImageUses are the images disks open as their keys name them: the image
// of a file, block or ISO disk, and the backing of an overlay (only read),
// with the cleaned path as ID; an iSCSI LUN (key "target") and an RBD
// image (key "image"), with their address as ID: one LUN or image that two
// disks write is written by two writers that know nothing of each other.
func ImageUses(disks []Disk) []ImageUse {
	var out []ImageUse
	for i, d := range disks {
		switch d.Type {
		case DiskFile, DiskBlock, DiskISO:
		case DiskISCSI, DiskRBD:
			out = append(out, networkUse(i, d))
			continue
		default:
			continue // seeds: no image of the user's
		}
		if d.File != "" {
			out = append(out, ImageUse{Disk: i, Key: "file", Path: d.File, ID: filepath.Clean(d.File), Write: !d.ReadOnly})
		}
		if d.Backing != "" {
			out = append(out, ImageUse{Disk: i, Key: "backing", Path: d.Backing, ID: filepath.Clean(d.Backing), Base: true})
		}
	}
	return out
}

// networkUse is the LUN or RBD image d opens; Path says it as the user
// would ("iscsi://PORTAL/IQN/LUN", "rbd:POOL/[NAMESPACE/]IMAGE[@SNAP]").
func networkUse(i int, d Disk) ImageUse {
	if d.Type == DiskISCSI {
		p := fmt.Sprintf("iscsi://%s/%s/%d", d.Portal, d.Target, d.LUN)
		return ImageUse{Disk: i, Key: "target", Path: p, ID: p, Write: !d.ReadOnly}
	}
	p := "rbd:" + d.Pool + "/"
	if d.Namespace != "" {
		p += d.Namespace + "/"
	}
	p += d.Image
	if d.Snapshot != "" {
		p += "@" + d.Snapshot
	}
	// One name in two clusters is two images: the ID names the cluster
	// by its monitors, else its ceph.conf.
	cluster := slices.Sorted(slices.Values(d.Monitors))
	return ImageUse{Disk: i, Key: "image", Path: p, ID: p + " on " + cmp.Or(strings.Join(cluster, ","), d.CephConf), Write: !d.ReadOnly}
}

// SharedImages refuses every use of an image that another disk of disks
// (an earlier one in uses) opens too, where either of the two writes it:
// QEMU's image lock would refuse the second at start. Two read-only disks
// may share an image. The error names both disks:
// `disk[1].file: /x/a.qcow2 is also disk "root"'s image (one image can back only one disk)`.
func (f *File) SharedImages(disks []Disk, uses []ImageUse) []error {
	var errs []error
	for j, u := range uses {
		if u.ID == "" {
			continue
		}
		for _, p := range uses[:j] {
			if p.ID != u.ID || p.Disk == u.Disk || !p.Write && !u.Write {
				continue
			}
			errs = append(errs, f.Errorf(fmt.Sprintf("disk[%d].%s", u.Disk, u.Key), "%s", sharedMsg(disks, u, p)))
			break
		}
	}
	return errs
}

// sharedMsg says that u's image is p's too.
func sharedMsg(disks []Disk, u, p ImageUse) string {
	what := u.Path
	if u.Base && u.Key == "file" {
		what = "its base image " + u.Path // from the image's own backing chain
	}
	role := "image"
	if p.Base {
		role = "base image"
	}
	if p.Path != u.Path {
		role += " " + p.Path
	}
	if p.Write && !u.Write {
		role += ", which it writes"
	}
	return fmt.Sprintf("%s is also disk %q's %s (one image can back only one disk)", what, disks[p.Disk].Name, role)
}

// validateSharedImages: the disks that passed their own checks (ok) name
// no image twice.
func (f *File) validateSharedImages(ok map[int]bool) []error {
	var uses []ImageUse
	for _, u := range ImageUses(f.VM.Disks) {
		if ok[u.Disk] {
			uses = append(uses, u)
		}
	}
	return f.SharedImages(f.VM.Disks, uses)
}
