// Package diskfds gives a starting QEMU its disks as descriptors (issue
// 45): QEMU starts paused (-S) without the disks whose images lie outside
// the VM's state directory (qemuargs.Options.DisksByFD); vmsup opens each
// image and every base of its chain itself, beneath the place the host
// allows (storage.OpenDisk, no symlinks), passes each level's descriptor
// (add-fd) and creates the nodes and devices the command line would have
// made (qemuargs.BootDisks, ChainParts), with each level its own node, so
// QEMU opens no host image by name and follows no header's backing name.
// A firmware boot is then reset, so the plugged devices' boot order
// applies; the start's later steps let the guest run.
//
// It owns the opening and passing of a disk's files, for boot and
// hot-plug alike; it decides nothing about the start or records (the
// supervisor's), nor about grants (internal/lifecycle/confine: QEMU's user needs
// none on a file it gets as a descriptor).
package diskfds

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// Step is the start step that plugs the disks, after the unit step.
const Step = "disks"

// Opener opens a file disk's image and backing chain beneath its place
// and checks them (places.Places.OpenDisk, whose ErrNoObject says a
// block device's ISO is opened by its entry).
type Opener func(ctx context.Context, d spec.Disk) (*storage.OpenedDisk, error)

// unplugTimeout bounds the undo of a device added by a plug that failed
// later (the guest has not run: it is gone at once).
const unplugTimeout = 5 * time.Second

// Boot plugs the disks the command line left out into the paused QEMU on
// c, in order, and with fresh (a guest that boots, not one whose state
// comes in: a migration, a memory snapshot) resets a firmware boot so
// that their boot indexes apply (firmware reads the boot order at reset).
// vm is the VM as it boots; own names, for a disk on a snapshot's
// overlay, the disk's own image (Pass). Errors name the disk and the file
// (the start step names the VM).
func Boot(ctx context.Context, c *qmp.Conn, vm *spec.VM, disks []qemuargs.BootDisk, open Opener, own map[string]string, fresh bool) error {
	for _, bd := range disks {
		if err := Plug(ctx, c, bd.Disk, own[bd.Disk.Name], bd.Parts, open); err != nil {
			return err
		}
	}
	if fresh && len(disks) > 0 && vm.Boot.Kernel == "" {
		if err := c.SystemReset(ctx); err != nil {
			return fmt.Errorf("system_reset after plugging the disks: %w", err)
		}
	}
	return nil
}

// Plug opens d's files, passes them to QEMU and adds p (the disk's parts
// as qemuargs.Disk or BootDisks render them by path) with its nodes on
// the descriptors: objects, nodes bottom level first, devices. vmsup's
// own descriptors are closed once QEMU holds copies. A failure removes
// what it added.
func Plug(ctx context.Context, c *qmp.Conn, d spec.Disk, own string, p qemuargs.DiskParts, open Opener) (err error) {
	pp, sets, err := Pass(ctx, c, d, own, p, open)
	if err != nil {
		return err
	}
	var added []func(context.Context)
	defer func() {
		if err != nil {
			uctx := context.WithoutCancel(ctx)
			for i := len(added) - 1; i >= 0; i-- {
				added[i](uctx)
			}
			RemoveSets(uctx, c, sets)
		}
	}()
	for _, st := range qdev.PlugDisk(c, d.Name, pp, unplugTimeout) {
		if err := st.Do(ctx); err != nil {
			return fmt.Errorf("disk %q: %w", d.Name, err)
		}
		if st.Undo != nil {
			added = append(added, st.Undo)
		}
	}
	return nil
}

// Pass opens d's files and passes them to QEMU, one fd set per chain
// level, and returns p with its nodes on those sets (ChainParts) and the
// sets added (for RemoveSets). own is the disk's own image when d.File is
// a snapshot's overlay on it ("" otherwise): the levels from the top down
// to it are the snapshots' images, which a removal commits into, so their
// sets get a read-write descriptor too; the bases below it (a template
// other VMs may share) only a read-only one.
func Pass(ctx context.Context, c *qmp.Conn, d spec.Disk, own string, p qemuargs.DiskParts, open Opener) (qemuargs.DiskParts, []int64, error) {
	levels, err := openLevels(ctx, d, open)
	if err != nil {
		return p, nil, fmt.Errorf("disk %q: %w", d.Name, err)
	}
	defer closeLevels(levels)
	writableDownTo(levels, d, own)
	direct := len(p.Blockdevs) > 0 && p.Blockdevs[0].Cache != nil && p.Blockdevs[0].Cache.Direct
	var sets []int64
	var chain []qemuargs.ChainLevel
	for i, l := range levels {
		set, err := passLevel(ctx, c, d.Name, i, l, direct)
		if err != nil {
			RemoveSets(context.WithoutCancel(ctx), c, sets)
			return p, nil, fmt.Errorf("disk %q: pass %s to QEMU: %w", d.Name, l.path, err)
		}
		sets = append(sets, set)
		chain = append(chain, qemuargs.ChainLevel{Filename: fmt.Sprintf("/dev/fdset/%d", set), Format: l.format, Write: l.write})
	}
	pp, err := qemuargs.ChainParts(d, p, chain)
	if err != nil {
		RemoveSets(context.WithoutCancel(ctx), c, sets)
		return p, nil, err
	}
	return pp, sets, nil
}

// RemoveSets takes fd sets back from QEMU (a failed plug's); QEMU closes
// a descriptor once no node uses it.
func RemoveSets(ctx context.Context, c *qmp.Conn, sets []int64) {
	for _, s := range sets {
		_ = c.RemoveFD(ctx, s, nil)
	}
}

// level is one opened file of a disk's chain.
type level struct {
	file   *os.File
	path   string
	format string
	write  bool // its set holds both access modes
}

// writableDownTo marks a writable file disk's levels from the top down to
// its own image own (none below: nothing writes a base under it).
func writableDownTo(ls []level, d spec.Disk, own string) {
	if own == "" || d.ReadOnly || d.Type != spec.DiskFile {
		return
	}
	k := slices.IndexFunc(ls, func(l level) bool { return filepath.Clean(l.path) == filepath.Clean(own) })
	for i := 0; i <= k; i++ {
		ls[i].write = true
	}
}

// PassFile passes f, the image file path that disk's device is to run on
// (a snapshot's overlay), into a new fd set with both access modes, named
// as its chain's top (qdev.FDSetFile finds it by path); direct: the
// disk's nodes open with O_DIRECT (qemuargs.CacheDirect).
func PassFile(ctx context.Context, c *qmp.Conn, disk, path string, f *os.File, direct bool) (int64, error) {
	return passLevel(ctx, c, disk, 0, level{file: f, path: path, write: true}, direct)
}

func closeLevels(ls []level) {
	for _, l := range ls {
		l.file.Close()
	}
}

// openLevels opens d's files: a file disk's (or an image place's ISO's)
// chain through open, a block device (or an ISO on one) by its entry,
// checked to be one.
func openLevels(ctx context.Context, d spec.Disk, open Opener) ([]level, error) {
	if d.Type != spec.DiskBlock {
		o, err := open(ctx, d)
		if err != nil && !errors.Is(err, places.ErrNoObject) {
			return nil, err
		}
		if o != nil {
			var ls []level
			for i, l := range o.Levels {
				f := l.Header.Format
				if f == "" {
					f = spec.FormatRaw
				}
				if i == 0 && d.Type == spec.DiskFile {
					f = d.Format
				}
				ls = append(ls, level{file: l.File, path: l.Path, format: f, write: l.Mode == "rwk"})
			}
			return ls, nil
		}
		if d.Type != spec.DiskISO {
			return nil, fmt.Errorf("%s: no image to open", d.File)
		}
	}
	f, err := openDevice(d)
	if err != nil {
		return nil, err
	}
	return []level{{file: f, path: d.File, format: d.Format, write: !d.ReadOnly && d.Type == spec.DiskBlock}}, nil
}

// openDevice opens a block device disk's entry (its directories hold
// symlinks by design: /dev/disk/by-id) and checks that the object is a
// block device.
func openDevice(d spec.Disk) (*os.File, error) {
	flags := unix.O_RDONLY
	if !d.ReadOnly && d.Type == spec.DiskBlock {
		flags = unix.O_RDWR
	}
	f, err := os.OpenFile(d.File, flags|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	o, err := storage.CheckDiskObject(f)
	if err == nil && o.Kind != storage.ObjectBlock {
		err = fmt.Errorf("%s is not a block device", d.File)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// passLevel passes one level into a new fd set: one descriptor, read-write
// for a writable level (a commit may write it), else read-only, because
// QEMU takes from a set the descriptor of the access mode it opens with,
// and its image locks belong to the open file description: a set holding
// two kept the locks of the one QEMU had switched away from, and a later
// commit's open found them (qemuargs.ChainParts). With direct (the disk's
// nodes have cache.direct: cache "none" or "directsync") it has O_DIRECT:
// QEMU opens the set with it, and from QEMU 9.1 takes only a descriptor
// whose O_DIRECT matches ("Failed to find file descriptor with matching
// flags"; 7.2 set it on the one it took).
func passLevel(ctx context.Context, c *qmp.Conn, disk string, i int, l level, direct bool) (int64, error) {
	if err := setFlags(l.file, direct); err != nil {
		return 0, err
	}
	f := l.file
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", f.Name(), err)
	}
	if (fl&unix.O_ACCMODE == unix.O_RDWR) != l.write {
		other, err := reopenOther(f)
		if err != nil {
			return 0, err
		}
		defer other.Close()
		f = other
	}
	info, err := c.AddFD(ctx, nil, qdev.FDChainOpaque(disk, i, l.path), f)
	if err != nil {
		return 0, err
	}
	return info.FDSetID, nil
}

// reopenOther opens the object f holds again with the other access mode
// (read-only for a read-write f, else read-write) and f's O_DIRECT:
// through its descriptor's /proc entry, which leads to that object and no
// name.
func reopenOther(f *os.File) (*os.File, error) {
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name(), err)
	}
	mode := unix.O_RDWR
	if fl&unix.O_ACCMODE == unix.O_RDWR {
		mode = unix.O_RDONLY
	}
	mode |= fl & unix.O_DIRECT
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), mode|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen %s: %w", f.Name(), err)
	}
	r := os.NewFile(uintptr(fd), f.Name())
	a, aerr := storage.Stat(f)
	b, berr := storage.Stat(r)
	if aerr != nil || berr != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		r.Close()
		return nil, fmt.Errorf("reopen %s: another object", f.Name())
	}
	return r, nil
}

// setFlags clears O_NONBLOCK (the checks opened with it: a FIFO must not
// hang vmsup; QEMU's own opens never ask for it) and sets O_DIRECT as
// direct says.
func setFlags(f *os.File, direct bool) error {
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err == nil {
		fl &^= unix.O_NONBLOCK | unix.O_DIRECT
		if direct {
			fl |= unix.O_DIRECT
		}
		_, err = unix.FcntlInt(f.Fd(), unix.F_SETFL, fl)
	}
	switch {
	case err != nil && direct:
		return fmt.Errorf("%s: open with O_DIRECT (cache \"none\" or \"directsync\"): %w", f.Name(), err)
	case err != nil:
		return fmt.Errorf("%s: clear O_NONBLOCK: %w", f.Name(), err)
	}
	return nil
}
