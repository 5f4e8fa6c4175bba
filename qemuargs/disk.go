package qemuargs

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"

	"github.com/vmsup/vmsup/spec"
)

// Blockdev is one block node. Its JSON encoding is both the value of
// -blockdev on the command line and the arguments object of QMP blockdev-add
// (BlockdevOptions), so boot and hotplug create identical nodes. A disk is two
// nodes: a protocol node (driver "file", "host_device", "iscsi" or "rbd") and
// a format node (qcow2 or raw) on top of it, created in that order and
// deleted in reverse. A qcow2 node opens its backing chain itself, read-only,
// from the image header.
type Blockdev struct {
	Driver   string `json:"driver"`
	NodeName string `json:"node-name"`
	Filename string `json:"filename,omitempty"` // file, host_device: the image or device path
	File     string `json:"file,omitempty"`     // format drivers: node-name of the protocol node
	// Backing (qcow2): the backing node's name as a JSON string, or null
	// for none; unset, QEMU opens the base the image header names.
	Backing  json.RawMessage `json:"backing,omitempty"`
	AIO      string          `json:"aio,omitempty"` // file, host_device: "threads", "native", "io_uring"
	Cache    *BlockdevCache  `json:"cache,omitempty"`
	Discard  string          `json:"discard,omitempty"` // "unmap" passes guest discards down
	ReadOnly bool            `json:"read-only"`
	// AutoReadOnly (file): opened read-only until a parent writes, then
	// reopened read-write (a commit into a base on a descriptor).
	AutoReadOnly bool `json:"auto-read-only,omitempty"`

	// iscsi (BlockdevOptionsIscsi)
	Transport      string `json:"transport,omitempty"` // "tcp" or "iser"
	Portal         string `json:"portal,omitempty"`
	Target         string `json:"target,omitempty"`
	LUN            *int   `json:"lun,omitempty"`
	PasswordSecret string `json:"password-secret,omitempty"` // id of a secret object
	InitiatorName  string `json:"initiator-name,omitempty"`
	HeaderDigest   string `json:"header-digest,omitempty"`

	// rbd (BlockdevOptionsRbd)
	Pool      string         `json:"pool,omitempty"`
	Image     string         `json:"image,omitempty"`
	Conf      string         `json:"conf,omitempty"`
	Server    []InetAddrBase `json:"server,omitempty"`
	KeySecret string         `json:"key-secret,omitempty"` // id of a secret object
	Snapshot  string         `json:"snapshot,omitempty"`
	Namespace string         `json:"namespace,omitempty"`
	// AuthClientRequired overrides ceph.conf's auth_client_required.
	AuthClientRequired []string `json:"auth-client-required,omitempty"`

	User string `json:"user,omitempty"` // iscsi: CHAP user; rbd: cephx id
}

// InetAddrBase is QEMU's InetSocketAddressBase (an RBD monitor).
type InetAddrBase struct {
	Host string `json:"host"`
	Port string `json:"port"`
}

// Object is one QOM object created with -object (JSON) at boot and with QMP
// object-add at hotplug: a secret that a block node reads its password or
// key from, or an iothread.
type Object struct {
	QOMType  string `json:"qom-type"` // "secret", "iothread", "rng-random", "memory-backend-ram", "-file" or "-memfd"
	ID       string `json:"id"`
	File     string `json:"file,omitempty"`     // secret: the file holding it (never the data itself)
	Filename string `json:"filename,omitempty"` // rng-random: the host's entropy source
	Size     int64  `json:"size,omitempty"`     // memory-backend-ram: bytes
	Format   string `json:"format,omitempty"`   // secret: "raw" or "base64"
	MemPath  string `json:"mem-path,omitempty"` // memory-backend-file: the hugetlbfs directory
	Share    *bool  `json:"share,omitempty"`    // memory-backend-file, -memfd: MAP_SHARED (always written)
	// CanonicalRAMID is a memory backend's x-use-canonical-path-for-ramblock-id:
	// false names its RAM block by its id, not its QOM path.
	CanonicalRAMID *bool `json:"x-use-canonical-path-for-ramblock-id,omitempty"`
	// sev-guest: the guest policy (always written: 0 is a policy) and the
	// host's C-bit position and reduced physical address bits.
	Policy          *uint32 `json:"policy,omitempty"`
	CBitPos         int     `json:"cbitpos,omitempty"`
	ReducedPhysBits int     `json:"reduced-phys-bits,omitempty"`
}

// Args renders the object for the command line: -object JSON.
func (o Object) Args() ([]string, error) {
	j, err := marshalJSON(o)
	if err != nil {
		return nil, fmt.Errorf("object %q: %w", o.ID, err)
	}
	return []string{"-object", j}, nil
}

// Args renders the node for the command line: -blockdev JSON.
func (b Blockdev) Args() ([]string, error) {
	j, err := marshalJSON(b)
	if err != nil {
		return nil, fmt.Errorf("blockdev %q: %w", b.NodeName, err)
	}
	return []string{"-blockdev", j}, nil
}

// BlockdevCache is BlockdevCacheOptions. Both fields are always written so
// the argv says what it does.
type BlockdevCache struct {
	Direct  bool `json:"direct"`   // O_DIRECT: bypass the host page cache
	NoFlush bool `json:"no-flush"` // ignore guest flushes (unsafe)
}

// DiskHost holds the host files vmsup prepared for one disk (package
// storage makes them; Build and hotplug only name them).
type DiskHost struct {
	// Image is the file QEMU opens for a disk whose image vmsup builds (a
	// seed ISO), or for a block device vmsup opened and passed to QEMU
	// ("/dev/fdset/N"); other types, and block devices without it, use the
	// spec's file.
	Image string
	// SecretFile holds the disk's CHAP password or cephx key (mode 0600), for
	// disks with NeedsSecret. The secret reaches QEMU only through it.
	SecretFile string
	// UUID is the VM's: an iSCSI disk without initiator_name logs in as
	// QEMU's default name for it, written out so the argv says it.
	UUID string
}

// DiskParts is everything one disk puts into QEMU, in creation order:
// objects (secret, iothread), then block nodes, then devices. Remove them in
// reverse: devices, nodes (last first), objects.
type DiskParts struct {
	Objects   []Object
	Blockdevs []Blockdev
	Devices   []Device
}

func (p DiskParts) renderers() []renderer {
	var out []renderer
	for _, o := range p.Objects {
		out = append(out, o)
	}
	for _, b := range p.Blockdevs {
		out = append(out, b)
	}
	for _, d := range p.Devices {
		out = append(out, d)
	}
	return out
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

// CacheDirect reports whether d's nodes open their files with O_DIRECT
// (cache "none" or "directsync"): a descriptor passed for them must have
// it too (diskfds).
func CacheDirect(d spec.Disk) bool { return cacheModes[d.Cache].cache.Direct }

// checkDisk validates what Disk relies on; field names are relative to
// the disk ("cache").
func checkDisk(d spec.Disk, h DiskHost) *Error {
	obj := fmt.Sprintf("disk %q", d.Name)
	fail := func(field, format string, args ...any) *Error {
		e := errorf(field, format, args...)
		e.Object = obj
		return e
	}
	if err := spec.ValidName(d.Name); err != nil {
		return fail("name", "%v", err)
	}
	path := func(field, p string) *Error {
		switch {
		case p == "":
			return fail(field, "missing path")
		case !filepath.IsAbs(p):
			return fail(field, "%q is not an absolute path", p)
		}
		if err := checkString(p); err != nil {
			return fail(field, "%v", err)
		}
		return nil
	}
	switch d.Type {
	case spec.DiskFile, spec.DiskBlock, spec.DiskISO:
		if e := path("file", d.File); e != nil {
			return e
		}
	case spec.DiskSeed:
		if e := path("Options.Disks.Image", h.Image); e != nil {
			return e
		}
	case spec.DiskISCSI:
		if d.Portal == "" || d.Target == "" {
			return fail("portal", "iSCSI needs portal and target")
		}
	case spec.DiskRBD:
		if d.Pool == "" || d.Image == "" {
			return fail("pool", "RBD needs pool and image")
		}
		for _, m := range d.Monitors {
			if _, _, err := net.SplitHostPort(m); err != nil {
				return fail("monitors", "%q is not HOST:PORT", m)
			}
		}
	default:
		return fail("type", "unknown disk type %q", d.Type)
	}
	if d.NeedsSecret() {
		if e := path("Options.Disks.SecretFile", h.SecretFile); e != nil {
			return e
		}
	}
	for field, v := range map[string]string{"portal": d.Portal, "target": d.Target, "pool": d.Pool,
		"image": d.Image, "user": d.User, "ceph_conf": d.CephConf} {
		if err := checkString(v); err != nil {
			return fail(field, "%v", err)
		}
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

// Disk returns what the disk puts into QEMU, with its device(s) on bus (a
// root port id on q35, "pci.0" on pc; Build also sets Addr on pc). Build
// renders it on the command line and the supervisor sends the very same
// values over QMP to hot-plug a disk. Errors are *Error with Object naming
// the disk.
func Disk(d spec.Disk, h DiskHost, bus string) (DiskParts, error) {
	if e := checkDisk(d, h); e != nil {
		return DiskParts{}, e
	}
	var p DiskParts
	cm := cacheModes[d.Cache]
	discard := ""
	if d.Discard {
		discard = "unmap"
	}
	cache := func() *BlockdevCache { return &BlockdevCache{Direct: cm.cache.Direct, NoFlush: cm.cache.NoFlush} }
	proto := Blockdev{
		NodeName: DiskFileNodeName(d.Name),
		Cache:    cache(),
		Discard:  discard,
		ReadOnly: d.ReadOnly,
	}
	secret := ""
	if d.NeedsSecret() {
		secret = DiskSecretID(d.Name)
		// The CHAP password is used as is; QEMU's rbd driver re-encodes the
		// secret in base64 for librados, so a cephx key (base64 text, as
		// `ceph auth get-key` prints it) is declared base64.
		format := "raw"
		if d.Type == spec.DiskRBD {
			format = "base64"
		}
		p.Objects = append(p.Objects, Object{QOMType: "secret", ID: secret, File: h.SecretFile, Format: format})
	}
	switch d.Type {
	case spec.DiskFile, spec.DiskISO:
		proto.Driver, proto.Filename, proto.AIO = "file", d.File, d.AIO
	case spec.DiskSeed:
		proto.Driver, proto.Filename, proto.AIO = "file", h.Image, d.AIO
	case spec.DiskBlock:
		proto.Driver, proto.Filename, proto.AIO = "host_device", d.File, d.AIO
		if h.Image != "" {
			proto.Filename = h.Image
		}
	case spec.DiskISCSI:
		lun := d.LUN
		proto.Driver, proto.Transport, proto.Portal, proto.Target, proto.LUN = "iscsi", cmp.Or(d.Transport, "tcp"), d.Portal, d.Target, &lun
		proto.User, proto.PasswordSecret = d.User, secret
		proto.InitiatorName, proto.HeaderDigest = d.InitiatorFor(h.UUID), d.HeaderDigest
	case spec.DiskRBD:
		proto.Driver, proto.Pool, proto.Image, proto.Conf = "rbd", d.Pool, d.Image, d.CephConf
		proto.User, proto.KeySecret = d.User, secret
		proto.Snapshot, proto.Namespace, proto.AuthClientRequired = d.Snapshot, d.Namespace, d.AuthClientRequired
		for _, m := range d.Monitors {
			host, port, _ := net.SplitHostPort(m)
			proto.Server = append(proto.Server, InetAddrBase{Host: host, Port: port})
		}
	}
	format := Blockdev{
		Driver:   d.Format,
		NodeName: DiskNodeName(d.Name),
		File:     proto.NodeName,
		Cache:    cache(),
		Discard:  discard,
		ReadOnly: d.ReadOnly,
	}
	p.Blockdevs = []Blockdev{proto, format}

	p.Devices = diskDevices(d, format.NodeName, bus)
	switch {
	case d.IOThread:
		id := DiskIOThreadID(d.Name)
		p.Devices[0].IOThread = id // virtio-blk, or the SCSI controller
		p.Objects = append(p.Objects, Object{QOMType: "iothread", ID: id})
	case d.IOThreadID > 0:
		p.Devices[0].IOThread = SharedIOThreadID(d.IOThreadID) // the VM's, made at boot
	case len(d.IOThreadMap) > 0 && p.Devices[0].Driver == "virtio-blk-pci":
		for _, e := range d.IOThreadMap {
			p.Devices[0].IOThreadVQMapping = append(p.Devices[0].IOThreadVQMapping,
				VQMapping{IOThread: SharedIOThreadID(e.Thread), VQs: e.Queues})
		}
	}
	tuneVirtio(&p.Devices[0], d)
	return p, nil
}

// tuneVirtio sets the disk's virtio tuning on its first device: the
// virtio-blk, or the SCSI controller (a SATA disk has none: spec refuses).
func tuneVirtio(dev *Device, d spec.Disk) {
	switch dev.Driver {
	case "virtio-blk-pci":
		dev.NumQueues, dev.QueueSize = d.Queues, d.QueueSize
	case "virtio-scsi-pci":
		dev.SCSINumQueues = d.Queues
	default:
		return
	}
	dev.EventIdx = d.EventIdx
}

// diskDevices are the disk's devices on bus: a virtio-blk; a virtio-scsi
// controller of its own with the SCSI device on it; or an AHCI device.
// A CD-ROM defaults to SCSI because the test guest (and any stock kernel)
// has virtio-scsi and sr_mod, while AHCI needs ahci/libata in the guest.
func diskDevices(d spec.Disk, drive, bus string) []Device {
	id := DiskDeviceID(d.Name)
	shareRW := false
	switch d.EffectiveBus() {
	case spec.BusVirtio:
		return []Device{{Driver: "virtio-blk-pci", ID: id, Bus: bus, Drive: drive, Serial: d.Serial,
			BootIndex: d.BootIndex, WriteCache: cacheModes[d.Cache].writeCache, ShareRW: &shareRW}}
	case spec.BusSATA:
		dev := Device{Driver: "ide-hd", ID: id, Bus: bus, Drive: drive, Serial: d.Serial, BootIndex: d.BootIndex,
			WriteCache: cacheModes[d.Cache].writeCache, ShareRW: &shareRW}
		if d.IsCDROM() {
			dev.Driver, dev.WriteCache, dev.ShareRW = "ide-cd", "", nil
		}
		return []Device{dev}
	}
	ctrl := DiskControllerID(d.Name)
	dev := Device{Driver: "scsi-hd", ID: id, Bus: ctrl + ".0", Drive: drive, Serial: d.Serial, BootIndex: d.BootIndex,
		WriteCache: cacheModes[d.Cache].writeCache, ShareRW: &shareRW}
	switch {
	case d.IsCDROM():
		dev.Driver, dev.WriteCache, dev.ShareRW = "scsi-cd", "", nil
	case d.Device == spec.DeviceLUN:
		// The guest's SCSI commands reach the LUN as they are: no serial or
		// write cache of QEMU's own.
		dev.Driver, dev.Serial, dev.WriteCache, dev.ShareRW = "scsi-block", "", "", nil
	}
	return []Device{{Driver: "virtio-scsi-pci", ID: ctrl, Bus: bus}, dev}
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
