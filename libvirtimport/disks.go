package libvirtimport

import (
	"fmt"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// LibvirtSecretDir is where libvirtd keeps persistent secrets, one file
// UUID.base64 each: a cephx key's file there holds the key as `ceph auth
// get-key` prints it, which is what a vmsup RBD disk's secret_file holds.
const LibvirtSecretDir = "/etc/libvirt/secrets"

// diskMapper converts one disk; its lines name the disk.
type diskMapper struct {
	c   *converter
	el  string // "devices/disk[N]"
	dev string // its target, "vda"
	src *libvirtxml.DomainDisk
	out fileDisk
}

// at is the path of sub (a path below the disk) as lines name it.
func (m *diskMapper) at(sub string) string {
	el := m.el
	if sub != "" {
		el += "/" + sub
	}
	return el + " (" + m.dev + ")"
}

// drop: the disk is not carried over; dropAt: sub is not.
func (m *diskMapper) drop(format string, args ...any) { m.c.drop(m.at(""), format, args...) }
func (m *diskMapper) dropAt(sub, format string, args ...any) {
	m.c.drop(m.at(sub), format, args...)
}

// note: a change the guest may notice in what sub carried over.
func (m *diskMapper) note(sub, format string, args ...any) { m.c.note(m.at(sub), format, args...) }

func (c *converter) disks(disks []libvirtxml.DomainDisk) {
	seen := map[string]bool{}
	for i := range disks {
		d := &disks[i]
		dev := ""
		if d.Target != nil {
			dev = d.Target.Dev
		}
		m := &diskMapper{c: c, el: fmt.Sprintf("devices/disk[%d]", i), dev: dev, src: d}
		m.out.Name, m.out.el = dev, m.at("")
		if spec.ValidName(dev) != nil || seen[dev] {
			m.out.Name = fmt.Sprintf("disk%d", i)
		}
		if !m.source() || !m.device() || !m.hostPaths() {
			continue
		}
		seen[m.out.Name] = true
		m.driver()
		if !m.objects() {
			continue
		}
		m.extras()
		c.out.Disks = append(c.out.Disks, m.out)
	}
}

// source maps where the disk's data is; false drops the disk.
func (m *diskMapper) source() bool {
	d, o := m.src, &m.out
	s := d.Source
	switch {
	case s == nil || (s.File == nil && s.Block == nil && s.Network == nil && s.Volume == nil):
		if d.Device == "cdrom" {
			m.drop("an empty CD-ROM drive: a vmsup CD-ROM holds an image (add the disk with its iso when there is one)")
		} else {
			m.drop("a disk without a source")
		}
		return false
	case s.File != nil:
		o.Type, o.File = spec.DiskFile, s.File.File
		if d.Device == "cdrom" {
			o.Type = spec.DiskISO
		}
	case s.Block != nil:
		o.Type, o.File = spec.DiskBlock, s.Block.Dev
	case s.Volume != nil:
		m.drop("storage pool volume %s/%s: name its path instead (virsh vol-path --pool %s %s)",
			s.Volume.Pool, s.Volume.Volume, s.Volume.Pool, s.Volume.Volume)
		return false
	default:
		return m.network(s.Network)
	}
	if o.File == "" {
		m.drop("no path")
		return false
	}
	return true
}

func (m *diskMapper) network(n *libvirtxml.DomainDiskSourceNetwork) bool {
	auth := m.src.Auth
	if n.Auth != nil {
		auth = n.Auth
	}
	var ok bool
	switch n.Protocol {
	case "rbd":
		ok = m.rbd(n)
	case "iscsi":
		ok = m.iscsi(n)
	default:
		m.drop("network protocol %q: vmsup reaches iSCSI and RBD only", n.Protocol)
	}
	if !ok {
		return false
	}
	if auth != nil {
		m.secret(auth)
	}
	if n.TLS == "yes" {
		m.dropAt("source/@tls", "TLS to the storage is not in vmsup")
	}
	return true
}

// rbd: name POOL/IMAGE or POOL/NAMESPACE/IMAGE, a snapshot (element or
// "@SNAP"), monitors, ceph.conf.
func (m *diskMapper) rbd(n *libvirtxml.DomainDiskSourceNetwork) bool {
	o := &m.out
	o.Type = spec.DiskRBD
	if pool, rest, ok := strings.Cut(n.Name, "/"); ok {
		o.Pool, o.Image = pool, rest
		if ns, img, ok := strings.Cut(rest, "/"); ok {
			o.Namespace, o.Image = ns, img
		}
	}
	if img, snap, ok := strings.Cut(o.Image, "@"); ok {
		o.Image, o.Snapshot = img, snap
	}
	if n.Snapshot != nil {
		o.Snapshot = n.Snapshot.Name
	}
	for _, h := range n.Hosts {
		o.Monitors = append(o.Monitors, hostPort(h, "6789"))
	}
	if n.Config != nil {
		o.CephConf = n.Config.File
	}
	if o.Pool == "" || o.Image == "" {
		m.drop("rbd name %q is not POOL/IMAGE", n.Name)
		return false
	}
	return true
}

// iscsi: name IQN/LUN, the first portal, iSER, the initiator name.
func (m *diskMapper) iscsi(n *libvirtxml.DomainDiskSourceNetwork) bool {
	o := &m.out
	o.Type = spec.DiskISCSI
	iqn, lun, _ := strings.Cut(n.Name, "/")
	o.Target = iqn
	if lun != "" {
		v, err := strconv.ParseUint(lun, 10, 16)
		if err != nil {
			m.drop("iscsi name %q: LUN %q is not a number", n.Name, lun)
			return false
		}
		o.LUN = v
	}
	if len(n.Hosts) == 0 {
		m.drop("iscsi disk without a host")
		return false
	}
	o.Portal = hostPort(n.Hosts[0], spec.DefaultISCSIPort)
	if n.Hosts[0].Transport == "rdma" {
		o.Transport = "iser"
	}
	if len(n.Hosts) > 1 {
		m.dropAt(fmt.Sprintf("source/host[1..%d]", len(n.Hosts)-1), "%d more portals: vmsup logs in to the first (multipath is not in vmsup)", len(n.Hosts)-1)
	}
	if n.Initiator != nil && n.Initiator.IQN != nil {
		o.InitiatorName = n.Initiator.IQN.Name
	}
	return true
}

// secret references the libvirt secret file, never copying it.
func (m *diskMapper) secret(a *libvirtxml.DomainDiskAuth) {
	o := &m.out
	o.User = a.Username
	if a.Secret == nil {
		return
	}
	if a.Secret.UUID == "" {
		m.dropAt("auth", "auth secret by usage %q: set secret_file to the file holding it", a.Secret.Usage)
		if o.Type == spec.DiskISCSI {
			o.User = "" // CHAP needs both
		}
		return
	}
	file := LibvirtSecretDir + "/" + a.Secret.UUID + ".base64"
	if o.Type == spec.DiskISCSI {
		// A CHAP password is used as the file has it; libvirt's is base64.
		o.SecretFile = "/etc/vmsup/secrets/" + a.Secret.UUID
		m.note("auth", "CHAP secret %s: vmsup reads the password as is: base64 -d %s > %s (mode 0600)", a.Secret.UUID, file, o.SecretFile)
		return
	}
	o.SecretFile = file
}

// hostPaths: the host allows every path the disk names (Options.CheckPath);
// false drops the disk, saying why.
func (m *diskMapper) hostPaths() bool {
	o := &m.out
	for _, p := range []struct{ what, field, path string }{
		{"source", "file", o.File}, {"secret", "secret_file", o.SecretFile}, {"ceph config", "ceph_conf", o.CephConf}} {
		if why := m.c.refused(p.what, p.field, p.path); why != "" {
			m.drop("%s", why)
			return false
		}
	}
	return true
}

// objects: the host allows the disk's image and chain as objects
// (Options.CheckDisk); false drops the disk, saying why.
func (m *diskMapper) objects() bool {
	o := &m.out
	if m.c.disk == nil || (o.Type != spec.DiskFile && o.Type != spec.DiskISO) {
		return true
	}
	d := spec.Disk{Name: o.Name, Type: o.Type, File: o.File, Format: o.Format, ReadOnly: o.ReadOnly}
	if d.Format == "" && d.Type == spec.DiskFile && strings.HasSuffix(strings.ToLower(d.File), ".qcow2") {
		d.Format = spec.FormatQcow2 // left out of the file as spec's default; opened as it
	}
	if err := m.c.disk(d); err != nil {
		m.drop("source %v", err)
		return false
	}
	return true
}

// device maps the guest side: bus and device kind; false drops the disk.
func (m *diskMapper) device() bool {
	d, o := m.src, &m.out
	bus := ""
	if d.Target != nil {
		bus = d.Target.Bus
	}
	switch d.Device {
	case "", "disk":
	case "cdrom":
		o.Device = spec.DeviceCDROM
		if o.Type != spec.DiskISO && o.Type != spec.DiskFile && o.Type != spec.DiskBlock {
			m.drop("a CD-ROM on %s storage: vmsup's CD-ROMs are images or host devices", o.Type)
			return false
		}
	case "lun":
		o.Device = spec.DeviceLUN
		if o.Type != spec.DiskISCSI && o.Type != spec.DiskBlock {
			m.drop("a lun on %s storage: passthrough is of an iSCSI LUN or a host SCSI device", o.Type)
			return false
		}
	default:
		m.drop("device %q: vmsup's disks are disks, CD-ROMs and LUNs", d.Device)
		return false
	}
	switch bus {
	case "", "virtio":
		if o.Device == spec.DeviceCDROM || o.Device == spec.DeviceLUN {
			o.Bus = spec.BusSCSI
		}
	case "scsi":
		o.Bus = spec.BusSCSI
		if o.Device == spec.DeviceCDROM || o.Device == spec.DeviceLUN {
			o.Bus = "" // the default for these
		}
	case "sata", "ide":
		o.Bus = spec.BusSATA
		if bus == "ide" || m.c.onPC() {
			o.Bus = spec.BusSCSI
			if !m.c.onPC() {
				o.Bus = spec.BusSATA
			}
			m.note("target/@bus", "%q on machine %s: the guest sees it on %s", bus, orQ35(m.c.out.Machine), o.Bus)
		}
	default:
		m.drop("bus %q: vmsup's disks are virtio, scsi or sata", bus)
		return false
	}
	if o.Type == spec.DiskISO {
		o.Device = "" // the default for an iso
		if o.Bus == spec.BusSCSI {
			o.Bus = ""
		}
	}
	return true
}

func orQ35(m string) string {
	if m == "" {
		return "q35"
	}
	return m
}

// driver maps format, cache, I/O mode, discard and the I/O thread.
func (m *diskMapper) driver() {
	dr, o := m.src.Driver, &m.out
	if dr == nil {
		return
	}
	switch dr.Type {
	case "", "raw":
		if o.Type == spec.DiskFile && strings.HasSuffix(strings.ToLower(o.File), ".qcow2") {
			o.Format = spec.FormatRaw // the extension would say qcow2
		}
	case "qcow2":
		if o.Type != spec.DiskFile {
			m.dropAt("driver/@type", "qcow2 on %s storage: vmsup opens it raw", o.Type)
		} else if !strings.HasSuffix(strings.ToLower(o.File), ".qcow2") {
			o.Format = spec.FormatQcow2
		}
	default:
		m.dropAt("driver/@type", "%q: vmsup opens qcow2 and raw images (qemu-img convert it)", dr.Type)
		o.Format = spec.FormatRaw
	}
	switch dr.Cache {
	case "", "default", "writeback":
	case "none", "writethrough", "directsync", "unsafe":
		o.Cache = dr.Cache
	}
	switch dr.IO {
	case "native":
		if o.Cache == "none" || o.Cache == "directsync" {
			o.AIO = "native"
		} else {
			m.dropAt("driver/@io", "native without cache none or directsync: threads it is")
		}
	case "io_uring":
		o.AIO = "io_uring"
	}
	if o.Type == spec.DiskISCSI || o.Type == spec.DiskRBD {
		o.AIO = ""
	}
	o.Discard = dr.Discard == "unmap"
	for _, p := range []struct{ attr, v string }{{"error_policy", dr.ErrorPolicy}, {"rerror_policy", dr.RErrorPolicy}} {
		if p.v != "" && p.v != "report" {
			m.dropAt("driver/@"+p.attr, "%q: QEMU's default (report errors to the guest) applies", p.v)
		}
	}
	m.diskTuning(dr)
}

// extras: read-only, serial, boot order, I/O limits and what has no key.
func (m *diskMapper) extras() {
	d, o := m.src, &m.out
	o.ReadOnly = d.ReadOnly != nil && o.Type != spec.DiskISO && o.Device != spec.DeviceCDROM
	if o.Snapshot != "" {
		o.ReadOnly = false // implied
	}
	if s := d.Serial; s != "" {
		if len(s) <= 20 && !strings.ContainsAny(s, ",\"' ") && o.Device != spec.DeviceLUN {
			o.Serial = s
		} else {
			m.dropAt("serial", "%q: vmsup's serials are at most 20 bytes without spaces, quotes or commas (none on a lun)", s)
		}
	}
	if d.Boot != nil && d.Boot.Order > 0 {
		o.BootIndex = d.Boot.Order
	}
	if t := d.IOTune; t != nil && o.Device != spec.DeviceLUN && o.Type != spec.DiskISO {
		o.IOPS, o.IOPSRead, o.IOPSWrite = t.TotalIopsSec, t.ReadIopsSec, t.WriteIopsSec
		o.BPS, o.BPSRead, o.BPSWrite = t.TotalBytesSec, t.ReadBytesSec, t.WriteBytesSec
		for _, b := range []struct {
			el  string
			set bool
		}{{"total_bytes_sec_max", t.TotalBytesSecMax > 0}, {"read_bytes_sec_max", t.ReadBytesSecMax > 0}, {"write_bytes_sec_max", t.WriteBytesSecMax > 0},
			{"total_iops_sec_max", t.TotalIopsSecMax > 0}, {"read_iops_sec_max", t.ReadIopsSecMax > 0}, {"write_iops_sec_max", t.WriteIopsSecMax > 0},
			{"group_name", t.GroupName != ""}} {
			if b.set {
				m.dropAt("iotune/"+b.el, "bursts and groups: vmsup sets the sustained limits only")
			}
		}
	}
	for _, x := range []struct {
		el  string
		set bool
		why string
	}{{"shareable", d.Shareable != nil, "vmsup locks a writable image to one VM"},
		{"transient", d.Transient != nil, "vmsup has no transient disks"},
		{"encryption", d.Encryption != nil, "encrypted images are not in vmsup"},
		{"source/encryption", d.Source != nil && d.Source.Encryption != nil, "encrypted images are not in vmsup"},
		{"wwn", d.WWN != "", "no WWN in vmsup"},
		{"vendor", d.Vendor != "", "vmsup's SCSI disks answer as QEMU's"},
		{"product", d.Product != "", "vmsup's SCSI disks answer as QEMU's"},
		{"source/reservations", d.Source != nil && d.Source.Reservations != nil, "persistent reservations pass through a lun disk as they are"},
		{"blockio", d.BlockIO != nil, "QEMU's block sizes apply"}} {
		if x.set {
			m.dropAt(x.el, "%s", x.why)
		}
	}
	if o.Snapshot != "" && d.ReadOnly == nil {
		// librbd cannot write a snapshot: libvirt passes read-only false
		// with auto-read-only and QEMU opens it read-only; vmsup says so.
		m.note("source/snapshot", "%q: opened read-only, as librbd opens a snapshot (libvirt passes read-only false and leaves it to QEMU's auto-read-only)", o.Snapshot)
	}
}

// bootOrder turns <os><boot dev=.../> into boot indexes when no device has
// its own order.
func (c *converter) bootOrder() {
	o := c.dom.OS
	if o == nil || len(o.BootDevices) == 0 {
		return
	}
	for _, d := range c.out.Disks {
		if d.BootIndex > 0 {
			return // per-device orders win, as in libvirt
		}
	}
	next := uint(1)
	for i, b := range o.BootDevices {
		var want func(fileDisk) bool
		switch b.Dev {
		case "hd":
			want = func(d fileDisk) bool { return d.Type != spec.DiskISO && d.Device != spec.DeviceCDROM }
		case "cdrom":
			want = func(d fileDisk) bool { return d.Type == spec.DiskISO || d.Device == spec.DeviceCDROM }
		default:
			c.drop(fmt.Sprintf("os/boot[%d]", i), "dev %q: vmsup boots from disks or a kernel (no network or floppy boot)", b.Dev)
			continue
		}
		for j := range c.out.Disks {
			if want(c.out.Disks[j]) {
				c.out.Disks[j].BootIndex = next
				next++
				break
			}
		}
	}
}
