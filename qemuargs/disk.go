package qemuargs

import (
	"fmt"
	"path/filepath"

	"github.com/vmsup/vmsup/spec"
)

// Blockdev is one block node. Its JSON encoding is both the value of
// -blockdev on the command line and the arguments object of QMP blockdev-add
// (BlockdevOptions), so boot and hotplug create identical nodes. A disk is two
// nodes: a protocol node (driver "file") and a format node (qcow2 or raw) on
// top of it, created in that order and deleted in reverse.
type Blockdev struct {
	Driver   string         `json:"driver"`
	NodeName string         `json:"node-name"`
	Filename string         `json:"filename,omitempty"` // driver "file": the image path
	File     string         `json:"file,omitempty"`     // format drivers: node-name of the protocol node
	AIO      string         `json:"aio,omitempty"`      // driver "file": "threads", "native", "io_uring"
	Cache    *BlockdevCache `json:"cache,omitempty"`
	Discard  string         `json:"discard,omitempty"` // "unmap" passes guest discards down
	ReadOnly bool           `json:"read-only"`
}

// BlockdevCache is BlockdevCacheOptions. Both fields are always written so
// the argv says what it does.
type BlockdevCache struct {
	Direct  bool `json:"direct"`   // O_DIRECT: bypass the host page cache
	NoFlush bool `json:"no-flush"` // ignore guest flushes (unsafe)
}

// Args renders the node for the command line: -blockdev JSON.
func (b Blockdev) Args() ([]string, error) {
	j, err := marshalJSON(b)
	if err != nil {
		return nil, fmt.Errorf("blockdev %q: %w", b.NodeName, err)
	}
	return []string{"-blockdev", j}, nil
}

// cacheMode is what one spec cache mode means for the nodes and the device,
// as in QEMU's documentation of -drive cache=.
type cacheMode struct {
	cache      BlockdevCache
	writeCache string // the device's write-cache property
}

var cacheModes = map[string]cacheMode{
	"writeback":    {BlockdevCache{Direct: false, NoFlush: false}, "on"},
	"none":         {BlockdevCache{Direct: true, NoFlush: false}, "on"},
	"writethrough": {BlockdevCache{Direct: false, NoFlush: false}, "off"},
	"directsync":   {BlockdevCache{Direct: true, NoFlush: false}, "off"},
	"unsafe":       {BlockdevCache{Direct: false, NoFlush: true}, "on"},
}

// checkDisk validates what DiskBlockdevs and DiskDevice rely on; field names
// are relative to the disk ("cache").
func checkDisk(d spec.Disk) *Error {
	obj := fmt.Sprintf("disk %q", d.Name)
	fail := func(field, format string, args ...any) *Error {
		e := errorf(field, format, args...)
		e.Object = obj
		return e
	}
	if err := spec.ValidName(d.Name); err != nil {
		return fail("name", "%v", err)
	}
	switch {
	case d.File == "":
		return fail("file", "missing image path")
	case !filepath.IsAbs(d.File):
		return fail("file", "%q is not an absolute path", d.File)
	}
	if err := checkString(d.File); err != nil {
		return fail("file", "%v", err)
	}
	switch d.Format {
	case spec.FormatQcow2, spec.FormatRaw:
	default:
		return fail("format", "unknown format %q (want %q or %q)", d.Format, spec.FormatQcow2, spec.FormatRaw)
	}
	cm, ok := cacheModes[d.Cache]
	if !ok {
		return fail("cache", "unknown cache mode %q", d.Cache)
	}
	switch d.AIO {
	case "threads", "io_uring":
	case "native":
		if !cm.cache.Direct {
			return fail("aio", "aio \"native\" needs cache \"none\" or \"directsync\", not %q", d.Cache)
		}
	default:
		return fail("aio", "unknown aio mode %q", d.AIO)
	}
	if err := checkString(d.Serial); err != nil {
		return fail("serial", "%v", err)
	}
	if len(d.Serial) > 20 { // virtio-blk truncates longer serials silently
		return fail("serial", "%q is longer than 20 bytes", d.Serial)
	}
	if d.BootIndex < 0 {
		return fail("boot_index", "%d is negative", d.BootIndex)
	}
	return nil
}

// DiskBlockdevs returns the disk's nodes in creation order: the protocol
// node (DiskFileNodeName) and the format node (DiskNodeName) on top of it.
// Add them with blockdev-add in this order; delete them in reverse. Errors
// are *Error with Object naming the disk.
func DiskBlockdevs(d spec.Disk) ([]Blockdev, error) {
	if e := checkDisk(d); e != nil {
		return nil, e
	}
	cm := cacheModes[d.Cache]
	discard := ""
	if d.Discard {
		discard = "unmap"
	}
	proto := Blockdev{
		Driver:   "file",
		NodeName: DiskFileNodeName(d.Name),
		Filename: d.File,
		AIO:      d.AIO,
		Cache:    &BlockdevCache{Direct: cm.cache.Direct, NoFlush: cm.cache.NoFlush},
		Discard:  discard,
		ReadOnly: d.ReadOnly,
	}
	format := Blockdev{
		Driver:   d.Format,
		NodeName: DiskNodeName(d.Name),
		File:     proto.NodeName,
		Cache:    &BlockdevCache{Direct: cm.cache.Direct, NoFlush: cm.cache.NoFlush},
		Discard:  discard,
		ReadOnly: d.ReadOnly,
	}
	return []Blockdev{proto, format}, nil
}

// DiskDevice returns the disk's virtio-blk-pci device on bus (a root port id
// on q35, "pci.0" on pc; Build also sets Addr on pc). It assumes d passed
// DiskBlockdevs; call that first.
func DiskDevice(d spec.Disk, bus string) Device {
	shareRW := false
	return Device{
		Driver:     "virtio-blk-pci",
		ID:         DiskDeviceID(d.Name),
		Bus:        bus,
		Drive:      DiskNodeName(d.Name),
		Serial:     d.Serial,
		BootIndex:  d.BootIndex,
		WriteCache: cacheModes[d.Cache].writeCache,
		ShareRW:    &shareRW,
	}
}

// ovmfBlockdevs are the UEFI flash nodes: the firmware code read-only and
// the VM's own variable store writable, attached with -machine
// pflash0=,pflash1= (QEMU 7.2 takes block nodes there; no -drive if=pflash).
func ovmfBlockdevs(code, vars string) []Blockdev {
	return []Blockdev{
		{Driver: "file", NodeName: OVMFCodeNodeName + "-file", Filename: code, ReadOnly: true},
		{Driver: "raw", NodeName: OVMFCodeNodeName, File: OVMFCodeNodeName + "-file", ReadOnly: true},
		{Driver: "file", NodeName: OVMFVarsNodeName + "-file", Filename: vars},
		{Driver: "raw", NodeName: OVMFVarsNodeName, File: OVMFVarsNodeName + "-file"},
	}
}
