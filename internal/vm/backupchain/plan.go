package backupchain

import (
	"fmt"
	"strings"
)

// Bitmap is a dirty bitmap an image holds (QEMU's view).
type Bitmap struct {
	Name         string
	Persistent   bool
	Recording    bool
	Inconsistent bool
}

// Disk is a disk as it is now: the image it runs on and its bitmaps.
type Disk struct {
	Name    string
	Image   string // the file the disk runs on (a snapshot's overlay, or its own)
	Format  string // of Image: only qcow2 holds persistent bitmaps
	Size    int64  // virtual size
	Bitmaps []Bitmap
}

// DiskPlan is how one disk goes into point N.
type DiskPlan struct {
	Disk    string `json:"disk"`
	Image   string `json:"image"`
	Mode    string `json:"mode"`
	Reason  string `json:"reason,omitempty"`
	File    string `json:"file"`              // in the directory
	Backing string `json:"backing,omitempty"` // incremental: the previous file
	Size    int64  `json:"size"`
	// Since is the bitmap an incremental copy reads (of the previous
	// point); NewBitmap the one made at this point ("" for a raw image).
	Since     string `json:"since,omitempty"`
	NewBitmap string `json:"new_bitmap,omitempty"`
	// Drop are the chain's bitmaps to remove before the copy: stale or
	// inconsistent ones (Since is kept).
	Drop []string `json:"drop,omitempty"`
}

// Plan plans disk d's part of point n, incremental when asked for and
// possible; a full one says why when an incremental was asked for.
func (m *Manifest) Plan(n int, incremental bool, d Disk) DiskPlan {
	p := DiskPlan{Disk: d.Name, Image: d.Image, Mode: Full, File: FileName(d.Name, n), Size: d.Size}
	if d.Format == "qcow2" {
		p.NewBitmap = BitmapName(m.Chain, n)
	}
	prev, last := m.Last(d.Name)
	since := BitmapName(m.Chain, prev)
	for _, b := range d.Bitmaps {
		if strings.HasPrefix(b.Name, BitmapPrefix(m.Chain)) && (b.Name != since || b.Inconsistent) {
			p.Drop = append(p.Drop, b.Name)
		}
	}
	if !incremental {
		return p
	}
	p.Reason = m.whyFull(d, prev, last, since)
	if p.Reason == "" {
		p.Mode, p.Since, p.Backing = Incremental, since, last.File
	}
	return p
}

// whyFull is why disk d cannot be incremental on its point prev ("" when
// it can).
func (m *Manifest) whyFull(d Disk, prev int, last *DiskPoint, since string) string {
	switch {
	case last == nil:
		return fmt.Sprintf("disk %q has no earlier backup in this directory", d.Name)
	case d.Format != "qcow2":
		return fmt.Sprintf("disk %q runs on a %s image (%s), which cannot hold a persistent dirty bitmap", d.Name, d.Format, d.Image)
	case d.Size != last.Size:
		return fmt.Sprintf("disk %q was resized since point %d (%d to %d bytes)", d.Name, prev, last.Size, d.Size)
	}
	for _, b := range d.Bitmaps {
		if b.Name != since {
			continue
		}
		switch {
		case b.Inconsistent:
			return fmt.Sprintf("disk %q: dirty bitmap %s is inconsistent (QEMU stopped without saving it: a host crash or a killed QEMU)", d.Name, since)
		case !b.Persistent || !b.Recording:
			return fmt.Sprintf("disk %q: dirty bitmap %s is not a recording persistent bitmap", d.Name, since)
		}
		return ""
	}
	// QEMU 7.2 writes a new persistent bitmap into the image only when it
	// closes it: a QEMU killed before that loses it.
	return fmt.Sprintf("disk %q: dirty bitmap %s (of point %d) is missing from %s (QEMU stopped without saving it, e.g. killed or a host crash before its first clean stop; or a snapshot moved the disk onto a new overlay; or point %d was taken with the VM off)",
		d.Name, since, prev, d.Image, prev)
}
