package qemuargs

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Fixed ids of the parts every VM has. Chardev, device, netdev and node-name
// ids live in separate QEMU namespaces; within each, the fixed ids below never
// start with the prefixes used for user-named disks and NICs.
const (
	ConsoleChardevID    = "console"        // serial console chardev
	QMPChardevID        = "qmp"            // QMP monitor for commands
	EventsChardevID     = "qmp-events"     // QMP monitor for events
	EventLogChardevID   = "event-log"      // QMP monitor writing events to a file (Options.EventLog)
	BalloonDeviceID     = "balloon"        // virtio-balloon-pci (spec balloon)
	WatchdogDeviceID    = "watchdog"       // i6300esb (spec watchdog)
	PanicDeviceID       = "pvpanic"        // ISA pvpanic (spec on_panic)
	RNGDeviceID         = "rng0"           // virtio-rng-pci (spec rng)
	RNGObjectID         = "rng0"           // its rng-random backend on /dev/urandom
	VMGenIDDeviceID     = "vmgenid0"       // vmgenid (spec vmgenid)
	VMCoreInfoDeviceID  = "vmcoreinfo0"    // vmcoreinfo (spec vmcoreinfo)
	AgentChardevID      = "guest-agent"    // qemu-ga channel chardev
	AgentSerialDeviceID = "virtio-serial0" // virtio-serial-pci carrying the agent port
	AgentPortDeviceID   = "guest-agent"    // virtserialport named AgentPortName
	AgentPortName       = "org.qemu.guest_agent.0"
	VsockDeviceID       = "vsock0"   // vhost-vsock-pci (spec [vsock])
	MainMemdevID        = "ram-main" // the boot memory's backend when it is not QEMU's default (hugepages without NUMA)

	OVMFCodeNodeName = "ovmf-code" // raw node attached as pflash0
	OVMFVarsNodeName = "ovmf-vars" // raw node attached as pflash1
)

// maxNodeName is the longest node-name QEMU accepts (bs->node_name is
// char[32]).
const maxNodeName = 31

// nodeSuffix shortens a disk name so that "file-"+suffix fits maxNodeName.
// Names of up to 25 bytes are used as they are; longer ones become their
// first 17 bytes, "-" and 8 hex digits of their SHA-256 (26 bytes), so a
// shortened name can never equal a name used as is.
func nodeSuffix(name string) string {
	const keep, short = 17, 25
	if len(name) <= short {
		return name
	}
	h := sha256.Sum256([]byte(name))
	return name[:keep] + "-" + hex.EncodeToString(h[:4])
}

// DiskNodeName is the node-name of the format node (qcow2 or raw) of the disk
// named disk: the node its device's drive= refers to.
func DiskNodeName(disk string) string { return "fmt-" + nodeSuffix(disk) }

// DiskFileNodeName is the node-name of the protocol ("file") node under
// DiskNodeName(disk).
func DiskFileNodeName(disk string) string { return "file-" + nodeSuffix(disk) }

// DiskDeviceID is the qdev id of the disk's virtio-blk-pci device (the id
// device_del and DEVICE_DELETED use).
func DiskDeviceID(disk string) string { return "disk-" + disk }

// DiskControllerID is the qdev id of the virtio-scsi controller a SCSI
// disk (or CD-ROM) sits on: its own, on the disk's root port.
func DiskControllerID(disk string) string { return "scsi-" + disk }

// SATAPort is the bus of the n-th port (0-based) of q35's AHCI controller.
func SATAPort(n int) string { return "ide." + strconv.Itoa(n) }

// DiskSecretID is the id of the secret object holding the disk's CHAP
// password or cephx key.
func DiskSecretID(disk string) string { return "sec-" + disk }

// DiskIOThreadID is the id of the disk's iothread object.
func DiskIOThreadID(disk string) string { return "io-" + disk }

// SharedIOThreadID is the id of the VM's n-th shared iothread object
// (spec iothreads, 1-based), which disks name by iothread_id.
func SharedIOThreadID(n int) string { return "iothread" + strconv.Itoa(n) }

// SEVObjectID is the id of the sev-guest object.
const SEVObjectID = "sev0"

// NICDeviceID is the qdev id of the NIC's virtio-net-pci device.
func NICDeviceID(nic string) string { return "nic-" + nic }

// NetdevID is the id of the NIC's -netdev backend (netdev_del takes it).
func NetdevID(nic string) string { return "net-" + nic }

// RootPortID is the id of the i-th pcie-root-port (1-based, equal to its
// chassis number): "rp1", "rp2", ...
func RootPortID(i int) string { return "rp" + strconv.Itoa(i) }
