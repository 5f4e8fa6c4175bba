package qemuargs

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Disks as descriptors (issue 45): a disk whose image lies outside the
// VM's state directory is left out of the command line when
// Options.DisksByFD is set, and QEMU starts paused (-S). The caller opens
// the image and its backing chain itself, passes each level's descriptor
// (add-fd) and creates the parts BootDisks gives, with each level's node
// on /dev/fdset/N (ChainParts), over QMP before the guest runs. So QEMU
// never opens a host image by name, nor follows a qcow2 header's backing
// name: every level is a node of its own with an explicit backing.

// PassedByFD reports whether d reaches QEMU as descriptors when
// Options.DisksByFD is set: a file, ISO or block device disk whose file
// lies outside stateDir. SATA disks stay on the command line: QEMU cannot
// add a device to an IDE bus once the machine is made.
func PassedByFD(d spec.Disk, stateDir string) bool {
	switch d.Type {
	case spec.DiskFile, spec.DiskISO, spec.DiskBlock:
	default:
		return false
	}
	if d.EffectiveBus() == spec.BusSATA || d.File == "" {
		return false
	}
	if stateDir == "" {
		return true
	}
	dir := filepath.Clean(stateDir)
	f := filepath.Clean(d.File)
	return f != dir && !strings.HasPrefix(f, dir+"/")
}

// BootDisk is one disk Build left out of the command line, with the parts
// it would have rendered there (bus and addr included), by path.
type BootDisk struct {
	Index int // in vm.Disks
	Disk  spec.Disk
	Parts DiskParts
}

// BootDisks are the disks of vm that Build leaves out under o (none
// without o.DisksByFD), in vm.Disks order, rendered as Build would have:
// the caller plugs them over QMP with the same ids, buses and addresses,
// so the guest sees the machine the command line would have made.
func BootDisks(vm *spec.VM, o Options) ([]BootDisk, error) {
	if !o.DisksByFD {
		return nil, nil
	}
	l, err := layout(vm)
	if err != nil {
		return nil, &Error{VM: vm.Name, Msg: err.Error()}
	}
	var out []BootDisk
	for i, d := range vm.Disks {
		if !o.byFD(d) {
			continue
		}
		p, err := bootDisk(vm, o, l, i)
		if err != nil {
			return nil, err
		}
		out = append(out, BootDisk{Index: i, Disk: d, Parts: p})
	}
	return out, nil
}

// bootDisk renders disk i of vm on its place in the layout.
func bootDisk(vm *spec.VM, o Options, l pciLayout, i int) (DiskParts, error) {
	d := vm.Disks[i]
	h := o.Disks[d.Name]
	h.UUID = vmUUID(vm, o)
	dp, err := Disk(d, h, l.disks[i].bus)
	if err != nil {
		return DiskParts{}, inField(err, fmt.Sprintf("disk[%d]", i))
	}
	dp.Devices[0].Addr = l.disks[i].addr
	return dp, nil
}

// ChainLevel is one level of a disk's image chain as QEMU is given it:
// the file it opens (/dev/fdset/N), the level's format, and whether a
// commit may write it (its fd set holds a read-write descriptor, and no
// other). Level 0 is the disk's own image.
type ChainLevel struct {
	Filename string
	Format   string // spec.FormatRaw or spec.FormatQcow2
	Write    bool
}

// ChainParts returns p (a disk's parts from Disk or BootDisks) with its
// image chain made explicit: the top level's nodes keep their names and
// open levels[0].Filename; every base is a format node on a file node of
// its own, and each qcow2 node names its backing node (the next level's,
// or null at the bottom), so QEMU opens nothing a header names. Base format
// nodes are read-only (a read-write one would hold its file's write lock);
// the file node of a base a snapshot's removal may commit into is opened
// read-write from the start, so the commit's reopen of its format node
// needs no other descriptor; the others read-only; none is auto-read-only. Each fd set then holds one
// open file description, in one mode: QEMU's image locks are per open
// file description, and one that auto-read-only switched away from kept
// its locks while the set held it, so a later commit's read-write open
// found the node's own old lock, and QEMU 7.2 aborted (TestSnapshots).
// Blockdevs are in creation order: the bottom level first.
func ChainParts(d spec.Disk, p DiskParts, levels []ChainLevel) (DiskParts, error) {
	if len(p.Blockdevs) != 2 || len(levels) == 0 {
		return DiskParts{}, fmt.Errorf("disk %q: %d nodes and %d chain levels: not a file disk's", d.Name, len(p.Blockdevs), len(levels))
	}
	proto, top := p.Blockdevs[0], p.Blockdevs[1]
	var nodes []Blockdev
	backing := json.RawMessage("null")
	for i := len(levels) - 1; i >= 0; i-- {
		lv := levels[i]
		file, format := proto, top
		if i > 0 {
			file = Blockdev{Driver: "file", NodeName: ChainFileNodeName(d.Name, i), AIO: proto.AIO,
				Cache: proto.Cache, ReadOnly: !lv.Write}
			format = Blockdev{NodeName: ChainNodeName(d.Name, i), File: file.NodeName, Cache: top.Cache, ReadOnly: true}
		}
		file.Filename = lv.Filename
		format.Driver = lv.Format
		if lv.Format == spec.FormatQcow2 {
			format.Backing = backing
		}
		nodes = append(nodes, file, format)
		backing = json.RawMessage(fmt.Sprintf("%q", format.NodeName))
	}
	p.Blockdevs = nodes
	return p, nil
}

// ChainNodeName is the node-name of the format node of level i (1 is the
// disk's image's base) of the disk's chain.
func ChainNodeName(disk string, i int) string { return fmt.Sprintf("b%02d-%s", i, nodeSuffix(disk)) }

// ChainFileNodeName is the node-name of the file node under
// ChainNodeName(disk, i).
func ChainFileNodeName(disk string, i int) string {
	return fmt.Sprintf("b%02df%s", i, nodeSuffix(disk))
}
