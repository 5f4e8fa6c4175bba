package spec

import (
	"fmt"
	"slices"
	"strings"
)

// How the guest sees a disk (bus, device) and the iSCSI and RBD options
// libvirt users bring along.

// Disk buses (the disk's "bus" key).
const (
	BusVirtio = "virtio" // virtio-blk: /dev/vdX
	BusSCSI   = "scsi"   // a virtio-scsi controller of its own: /dev/sdX, /dev/srN
	BusSATA   = "sata"   // q35's built-in AHCI controller: /dev/sdX; not hot-pluggable
)

// Disk devices (the disk's "device" key).
const (
	DeviceDisk  = "disk"
	DeviceCDROM = "cdrom"
	DeviceLUN   = "lun" // SCSI passthrough (scsi-block): the guest talks SCSI to the LUN itself
)

// MaxSATADisks is the number of ports of q35's AHCI controller (ich9-ahci).
const MaxSATADisks = 6

// iSCSI options.
var (
	headerDigests  = []string{"none", "crc32c", "crc32c-none", "none-crc32c"}
	iscsiTransport = []string{"tcp", "iser"}
	cephAuths      = []string{"cephx", "none"}
)

// DefaultInitiatorPrefix is QEMU's initiator name prefix; QEMU appends the
// VM's UUID (libvirt passes -uuid, so its guests log in with the same).
const DefaultInitiatorPrefix = "iqn.2008-11.org.linux-kvm"

// InitiatorFor is the initiator name a disk logs in with when the VM has
// uuid (the disk's own initiator_name first).
func (d *Disk) InitiatorFor(uuid string) string {
	if d.InitiatorName != "" || uuid == "" {
		return d.InitiatorName
	}
	return DefaultInitiatorPrefix + ":" + uuid
}

// IsCDROM reports whether the guest sees the disk as a CD-ROM.
func (d *Disk) IsCDROM() bool {
	return d.Device == DeviceCDROM || (d.Device == "" && (d.Type == DiskISO || d.Type == DiskSeed))
}

// EffectiveBus is the disk's bus, its default for a disk recorded before
// the key existed (virtio, or scsi for a CD-ROM).
func (d *Disk) EffectiveBus() string {
	switch {
	case d.Bus != "":
		return d.Bus
	case d.IsCDROM() || d.Device == DeviceLUN:
		return BusSCSI
	}
	return BusVirtio
}

func (d *Disk) applyBusDefaults() {
	if d.Device == "" {
		d.Device = DeviceDisk
		if d.Type == DiskISO || d.Type == DiskSeed {
			d.Device = DeviceCDROM
		}
	}
	d.Bus = d.EffectiveBus() // virtio-blk has no CD-ROM and no passthrough
	if d.Type == DiskISCSI && d.Transport == "" {
		d.Transport = "tcp"
	}
	if d.Snapshot != "" {
		d.ReadOnly = true // librbd opens snapshots read-only
	}
}

// diskBus: the bus and device fit each other and the disk's type.
func diskBus(d *Disk, fail diskFail) error {
	switch d.Bus {
	case BusVirtio, BusSCSI, BusSATA:
	default:
		return fail("bus", "unknown bus %q (want \"virtio\", \"scsi\" or \"sata\")", d.Bus)
	}
	switch d.Device {
	case DeviceDisk, DeviceCDROM, DeviceLUN:
	default:
		return fail("device", "unknown device %q (want \"disk\", \"cdrom\" or \"lun\")", d.Device)
	}
	switch {
	case (d.Type == DiskISO || d.Type == DiskSeed) && d.Device != DeviceCDROM:
		return fail("device", "a disk of type %q is a CD-ROM", d.Type)
	case d.Device == DeviceCDROM && d.Bus == BusVirtio:
		return fail("bus", "virtio-blk has no CD-ROM: use bus \"scsi\" or \"sata\"")
	case d.Device == DeviceCDROM && d.Type != DiskISO && d.Type != DiskSeed && d.Type != DiskFile && d.Type != DiskBlock:
		return fail("device", "a CD-ROM is an iso, seed, file or block disk, not %q", d.Type)
	case d.Device == DeviceLUN && d.Bus != BusSCSI:
		return fail("bus", "a \"lun\" is SCSI passthrough: it needs bus \"scsi\"")
	case d.Device == DeviceLUN && d.Type != DiskISCSI && d.Type != DiskBlock:
		return fail("device", "a \"lun\" passes through an iSCSI LUN or a host SCSI block device, not a %q disk", d.Type)
	case d.Device == DeviceLUN && d.Format != FormatRaw:
		return fail("format", "a \"lun\" is the device itself: format \"raw\", not %q", d.Format)
	case d.Device == DeviceLUN && d.Limited():
		return fail("iops", "I/O limits do not apply to SCSI passthrough (the guest's commands go to the LUN as they are)")
	case d.Bus == BusSATA && d.IOThread:
		return fail("iothread", "a SATA disk has no I/O thread (AHCI runs in QEMU's main loop)")
	}
	return nil
}

// diskNet: the iSCSI and RBD options beyond the address.
func diskNet(d *Disk, fail diskFail) error {
	if n := d.InitiatorName; n != "" {
		if !strings.HasPrefix(n, "iqn.") && !strings.HasPrefix(n, "eui.") && !strings.HasPrefix(n, "naa.") {
			return fail("initiator_name", "%q is not an iSCSI name (iqn.YYYY-MM.domain:name)", n)
		}
		if len(n) > 223 || strings.ContainsAny(n, " ,\"'") {
			return fail("initiator_name", "%q: at most 223 bytes, no spaces, quotes or commas", n)
		}
	}
	if d.HeaderDigest != "" && !slices.Contains(headerDigests, d.HeaderDigest) {
		return fail("header_digest", "unknown digest %q (want one of %q)", d.HeaderDigest, headerDigests)
	}
	if d.Type == DiskISCSI && !slices.Contains(iscsiTransport, d.Transport) {
		return fail("transport", "unknown transport %q (want \"tcp\" or \"iser\")", d.Transport)
	}
	for _, v := range []struct{ key, s string }{{"snapshot", d.Snapshot}, {"namespace", d.Namespace}} {
		if strings.ContainsAny(v.s, "/@") {
			return fail(v.key, "%q must not contain '/' or '@'", v.s)
		}
	}
	for i, a := range d.AuthClientRequired {
		if !slices.Contains(cephAuths, a) {
			return fail(fmt.Sprintf("auth_client_required[%d]", i), "unknown mode %q (want \"cephx\" or \"none\")", a)
		}
		if slices.Index(d.AuthClientRequired, a) != i {
			return fail(fmt.Sprintf("auth_client_required[%d]", i), "%q is listed twice", a)
		}
	}
	return nil
}

// validateSATA: AHCI exists on q35 only, with six ports.
func (f *File) validateSATA() error {
	n := 0
	for i, d := range f.VM.Disks {
		if d.Bus != BusSATA {
			continue
		}
		if !f.VM.Q35() {
			return f.Errorf(fmt.Sprintf("disk[%d].bus", i), "\"sata\" needs machine \"q35\" (its AHCI controller), not %q", f.VM.Machine)
		}
		if n++; n > MaxSATADisks {
			return f.Errorf(fmt.Sprintf("disk[%d].bus", i), "more than %d SATA disks (q35's AHCI has %d ports)", MaxSATADisks, MaxSATADisks)
		}
	}
	return nil
}
