package spec

import (
	"strings"
	"time"
)

// VM is one virtual machine as written in a TOML file. Field comments give the
// TOML key and the default Load fills in; testdata/example.toml is the
// commented reference a user copies.
type VM struct {
	Name        string `toml:"name"`        // required: [A-Za-z0-9][A-Za-z0-9_.-]*, at most 64 bytes
	Description string `toml:"description"` // free text, shown by status
	Machine     string `toml:"machine"`     // "q35" (default), "pc", or a versioned type of either (machine.go)
	Accel       Accel  `toml:"accel"`       // "auto" (default), "kvm" or "tcg"
	CPUModel    string `toml:"cpu_model"`   // default "host" under KVM, "max" under TCG
	// CPU are the CPU's features beyond its model: Hyper-V
	// enlightenments (display.go).
	CPU CPUFeatures `toml:"cpu"`
	// RTC is the base of the guest's real-time clock: "utc" (default) or
	// "localtime" (Windows).
	RTC       string     `toml:"rtc"`
	CPUs      int        `toml:"cpus"`       // default 1
	MaxCPUs   int        `toml:"max_cpus"`   // vCPU hotplug ceiling; default = cpus
	Topology  Topology   `toml:"topology"`   // sockets, dies, cores, threads (topology.go)
	Pinning   Pinning    `toml:"pinning"`    // vCPU and emulator threads on host CPUs (pinning.go)
	NUMA      []NUMANode `toml:"numa"`       // guest NUMA nodes (numa.go); none: one node
	Memory    Size       `toml:"memory"`     // required, e.g. "512M"
	MaxMemory Size       `toml:"max_memory"` // memory hotplug ceiling; default = memory (no hotplug)
	// Hugepages backs all guest memory (boot, NUMA nodes, hot-plugged
	// DIMMs) by hugetlbfs pages of this size: "2M" or "1G"; unset: ordinary
	// memory (hugepages.go).
	Hugepages string `toml:"hugepages"`
	// SharedMemory: unset (or true), a QEMU with cpr-transfer (QEMU 10)
	// maps the guest's memory as shared memory, which a new QEMU takes
	// over in place at migrate --local; false keeps it private (KSM and
	// transparent huge pages as usual; a local migration copies it).
	// Memory on hugepages or encrypted by SEV is never shared
	// (hugepages.go).
	SharedMemory *bool `toml:"shared_memory"`
	// IOThreads is a pool of I/O threads disks share by number
	// (disk.iothread_id 1..iothreads); 0: none (tuning.go).
	IOThreads int `toml:"iothreads"`
	// SEV runs the guest with AMD SEV memory encryption (sev.go); unset:
	// unencrypted.
	SEV *SEV `toml:"sev"`
	// HotplugSlots is the number of empty PCIe root ports reserved for disk and
	// NIC hotplug on q35 (default 8). q35 cannot hotplug onto pcie.0 itself.
	HotplugSlots *int     `toml:"hotplug_slots"`
	StopTimeout  Duration `toml:"stop_timeout"` // graceful shutdown bound; default "60s"
	// Shutdown is how down and systemctl stop ask the guest to power off:
	// "acpi" (the power button; default) or "agent" (qemu-ga's
	// guest-shutdown, falling back to ACPI when the agent does not answer).
	Shutdown   string `toml:"shutdown"`
	GuestAgent *bool  `toml:"guest_agent"` // qemu-ga channel; default true
	// Balloon adds a virtio-balloon device; BalloonTarget is the memory the
	// guest is asked to keep (0: all of it), changed live by apply.
	Balloon       bool `toml:"balloon"`
	BalloonTarget Size `toml:"balloon_target"`
	Autostart     bool `toml:"autostart"` // up also enables it for boot (vmsup enable)
	// Failure handling (failure.go): a guest panic (a pvpanic device when
	// set), QEMU dying, and the restarts either may cause; a watchdog.
	OnPanic       string   `toml:"on_panic"`       // "restart", "poweroff", "pause", "preserve"; unset: no pvpanic
	OnCrash       string   `toml:"on_crash"`       // "stop" (default) or "restart"
	RestartLimit  int      `toml:"restart_limit"`  // restarts within restart_window; default 10
	RestartWindow Duration `toml:"restart_window"` // default "1m"
	Watchdog      string   `toml:"watchdog"`       // a watchdog and its action ("reset", "poweroff", ...); unset: none
	// WatchdogModel is the watchdog the guest drives (failure.go):
	// "i6300esb" (default, a PCI card), "itco" (q35's own TCO watchdog in
	// its chipset, armed) or "ib700" (an ISA card).
	WatchdogModel string `toml:"watchdog_model"`
	// Identity and platform devices (identity.go).
	UUID       string  `toml:"uuid"`       // default: generated at the first start, then kept (recorded)
	VMGenID    bool    `toml:"vmgenid"`    // a vmgenid device; its id is generated with the UUID and kept
	RNG        *bool   `toml:"rng"`        // virtio-rng from the host's /dev/urandom; default true
	RNGRate    RNGRate `toml:"rng_rate"`   // at most bytes per period from the RNG; unset: no limit (tuning.go)
	VMCoreInfo *bool   `toml:"vmcoreinfo"` // the vmcoreinfo device (guest crash-dump notes); default true

	Boot  Boot   `toml:"boot"`
	Vsock Vsock  `toml:"vsock"` // a vhost-vsock device and its CID (vsock.go)
	Disks []Disk `toml:"disk"`
	NICs  []NIC  `toml:"nic"`
	// SecurityGroups are named rule sets the VM's network NICs name
	// (secgroup.go).
	SecurityGroups []SecurityGroup `toml:"security_group"`
	// HostDevs are host PCI devices passed through whole (VFIO; hostdev.go).
	HostDevs []HostDev `toml:"hostdev"`
	Limits   Limits    `toml:"limits"`
	// Security is the VM's confinement (see security.go).
	Security Security `toml:"security"`
	// Health is how a restart by apply (or up --restart-changed) decides
	// that the new spec works (see health.go).
	Health Health `toml:"health"`
	// Console bounds the serial console's log (failure.go).
	Console Console `toml:"console"`
	// SMBIOS are the firmware's system strings and OEM strings; Credentials
	// are systemd credentials (name = value) passed to the guest as SMBIOS
	// OEM strings, through files, never on QEMU's command line.
	SMBIOS      SMBIOS            `toml:"smbios"`
	Credentials map[string]string `toml:"credentials"`
	// Guest devices (guestdev.go): a TPM 2.0, host folders.
	TPM    *TPM    `toml:"tpm"`
	Shares []Share `toml:"share"`
	// Display is a graphical console (display.go); unset: none.
	Display *Display `toml:"display"`
	// Placement constrains where a fleet runs the VM (placement.go).
	Placement Placement `toml:"placement"`
}

// Accel is the accelerator choice.
type Accel string

// Accelerators. AccelAuto picks KVM only where it can run a stock guest.
const (
	AccelAuto Accel = "auto"
	AccelKVM  Accel = "kvm"
	AccelTCG  Accel = "tcg"
)

// Firmware kinds.
const (
	FirmwareBIOS  = "bios"  // SeaBIOS
	FirmwareUEFI  = "uefi"  // OVMF, with a per-VM copy of the variable store
	FirmwareQboot = "qboot" // minimal firmware for direct kernel boot
)

// Boot says how the guest starts: direct kernel boot when Kernel is set,
// otherwise firmware boot from the disks.
type Boot struct {
	Firmware string `toml:"firmware" vmsup:"notpath"` // "bios" (default), "uefi" or "qboot"
	Kernel   string `toml:"kernel" vmsup:"hostpath"`  // path; relative paths are relative to the TOML file
	Initrd   string `toml:"initrd" vmsup:"hostpath"`  // path; needs kernel
	Cmdline  string `toml:"cmdline"`                  // kernel command line; needs kernel
	// CmdlineMax raises the cmdline's limit (DefaultCmdlineMax) up to
	// MaxCmdline, for the rare kernel that takes more.
	CmdlineMax int `toml:"cmdline_max"`
	// Strict boots only from the devices with a boot order (disks'
	// boot_index, the kernel): -boot strict=on; default true.
	Strict *bool `toml:"strict"`
	// SecureBoot runs OVMF's Secure Boot firmware (SMM) with it enforced
	// (firmware "uefi", machine "q35"); the VM's variable store is copied
	// at its first start from VarsTemplate, by default the distribution's
	// one with Microsoft's keys enrolled. VarsTemplate (a path) is how a
	// user's own PK/KEK/db come in (a store made with virt-fw-vars).
	SecureBoot   bool   `toml:"secure_boot"`
	VarsTemplate string `toml:"vars_template" vmsup:"hostpath,firmware"`
}

// Disk formats.
const (
	FormatQcow2 = "qcow2"
	FormatRaw   = "raw"
)

// Disk is a block device: an image file, a host block device, an ISO, a
// cloud-init seed vmsup builds, an iSCSI LUN or a Ceph RBD image. Which keys
// apply depends on Type (see disk.go and testdata/example.toml).
type Disk struct {
	Name     string `toml:"name"`                       // required, unique in the VM; the QEMU node and device id derive from it
	Type     string `toml:"type"`                       // "file" (default), "block", "iso", "seed", "iscsi", "rbd"
	File     string `toml:"file" vmsup:"hostpath,disk"` // file, block (device path), iso: required image path
	Format   string `toml:"format"`                     // "qcow2" or "raw"; default from the file extension for type file, else raw
	Size     Size   `toml:"size"`                       // file: create the image with this size if it does not exist
	Backing  string `toml:"backing" vmsup:"hostpath"`   // file, qcow2: base image; a missing file is created as an overlay on it
	ReadOnly bool   `toml:"read_only"`                  // open the image read-only (always for iso and seed)
	// Shared lets other VMs open this disk's image (as their disk or its
	// base): an image belongs to the VM whose disk writes it, and vmsup
	// refuses another VM's up on it unless the owner's disk says shared.
	Shared    bool   `toml:"shared"`
	Cache     string `toml:"cache"`      // "writeback" (default), "none", "writethrough", "directsync", "unsafe"
	AIO       string `toml:"aio"`        // "threads" (default), "native" (needs cache none/directsync), "io_uring"
	Discard   bool   `toml:"discard"`    // pass guest discards (unmap) to the image
	Serial    string `toml:"serial"`     // guest-visible serial, at most 20 bytes
	BootIndex int    `toml:"boot_index"` // firmware boot order, 0 = not bootable
	IOThread  bool   `toml:"iothread"`   // run the disk's I/O (or its SCSI controller's) in its own thread
	// IOThreadID runs it in the VM's shared I/O thread of this number
	// (1..iothreads) instead; Queues, QueueSize and EventIdx tune the
	// virtio device (tuning.go).
	IOThreadID int `toml:"iothread_id"`
	// IOThreadMap spreads a virtio-blk disk's queues over the VM's shared
	// I/O threads (QEMU 9's iothread-vq-mapping; tuning.go).
	IOThreadMap []IOThreadQueues `toml:"iothread_map"`
	Queues      int              `toml:"queues"`     // virtio queues (virtio-blk num-queues, the SCSI controller's num_queues); 0: QEMU's
	QueueSize   int              `toml:"queue_size"` // virtio-blk: each queue's size, a power of 2, 4..1024; 0: QEMU's
	EventIdx    *bool            `toml:"event_idx"`  // virtio's event index feature; unset: QEMU's (on)
	// Bus and Device are how the guest sees the disk (disk.go): bus
	// "virtio" (default: virtio-blk, /dev/vdX), "scsi" (its own virtio-scsi
	// controller, /dev/sdX) or "sata" (q35's AHCI); device "disk"
	// (default), "cdrom" (default for iso and seed, on scsi) or "lun" (SCSI
	// passthrough of an iSCSI LUN or a host SCSI device: scsi-block).
	Bus    string `toml:"bus"`
	Device string `toml:"device" vmsup:"notpath"` // "disk", "cdrom" or "lun": how the guest sees it
	// IOLimits throttle the disk (QEMU's block_set_io_throttle); they can
	// change while the VM runs (vmsup apply).
	IOLimits

	// iscsi
	Portal string `toml:"portal"` // "HOST:PORT" (port default 3260)
	Target string `toml:"target"` // target IQN
	LUN    int    `toml:"lun"`    // default 0
	// InitiatorName is the name vmsup's QEMU logs in with; default
	// "iqn.2008-11.org.linux-kvm:UUID" (QEMU's own default, libvirt's too).
	InitiatorName string `toml:"initiator_name"`
	HeaderDigest  string `toml:"header_digest"` // "none", "crc32c", "crc32c-none", "none-crc32c"; default libiscsi's
	Transport     string `toml:"transport"`     // "tcp" (default) or "iser" (RDMA)

	// rbd
	Pool string `toml:"pool"` // required
	// Image is the RBD image's name (required), or for a file disk a
	// stored image (an alias of `vmsup image ls`, or sha256:HEX) the
	// disk's file is made a qcow2 overlay on at its first start
	// (internal/imagestore).
	Image     string   `toml:"image" vmsup:"notpath"`
	Monitors  []string `toml:"monitors"`                          // "HOST:PORT"; default: from ceph_conf
	CephConf  string   `toml:"ceph_conf" vmsup:"hostpath,config"` // ceph.conf path; default librados' own search
	Snapshot  string   `toml:"snapshot"`                          // open this snapshot of the image (read-only)
	Namespace string   `toml:"namespace"`                         // the image's RADOS namespace in the pool
	// AuthClientRequired overrides ceph.conf's auth_client_required:
	// ["cephx"], ["none"] or both, in order of preference.
	AuthClientRequired []string `toml:"auth_client_required"`

	// iscsi and rbd
	User       string `toml:"user"`                                // iscsi: CHAP user; rbd: cephx id ("admin")
	SecretFile string `toml:"secret_file" vmsup:"hostpath,config"` // file holding the CHAP password or the cephx key; copied 0600 into the state dir

	// seed: cloud-init NoCloud data, inline or from files (not both)
	UserData          string `toml:"user_data"`
	MetaData          string `toml:"meta_data"` // default "instance-id: NAME\nlocal-hostname: NAME\n"
	NetworkConfig     string `toml:"network_config" vmsup:"notpath"`
	UserDataFile      string `toml:"user_data_file" vmsup:"hostpath"`
	MetaDataFile      string `toml:"meta_data_file" vmsup:"hostpath"`
	NetworkConfigFile string `toml:"network_config_file" vmsup:"hostpath"`
}

// NIC types.
const (
	NICUser   = "user"   // QEMU user-mode networking (no host set-up)
	NICBridge = "bridge" // a tap vmsup creates, attached to an existing Linux bridge
	NICOVS    = "ovs"    // a tap vmsup creates, added as a port of an Open vSwitch bridge
	NICCNI    = "cni"    // wired by a CNI network config in a network namespace vmsup makes for the VM
	// NICNetwork is a tap on a vmsup-managed network (vmsup network
	// create): DHCP and DNS from the network, anti-spoofing, security groups.
	NICNetwork = "network"
)

// NIC is a network interface. The host-side fields (bridge, cni_config,
// tap, mtu) are used by the NIC types named in their comments; nic.go has
// their checks and defaults.
type NIC struct {
	Name     string   `toml:"name"`     // required, unique in the VM
	Type     string   `toml:"type"`     // "user" (default), "bridge", "ovs" or "cni"
	MAC      string   `toml:"mac"`      // default derived from the VM name and NIC index
	Forwards []string `toml:"forwards"` // user NICs: host forwards "tcp:127.0.0.1:2222-:22"

	Bridge    string `toml:"bridge"`                             // bridge: the Linux bridge; ovs: the OVS bridge (must exist)
	CNIConfig string `toml:"cni_config" vmsup:"hostpath,config"` // cni: path of a .conflist (or a single-plugin .conf)
	Tap       string `toml:"tap"`                                // bridge/ovs/cni: tap name; default derived from VM and NIC name
	MTU       int    `toml:"mtu"`                                // bridge/ovs/cni: tap and guest MTU; 0 = the bridge's (1500 for cni)
	// Queues is the number of virtio-net queue pairs (tap NICs); default 1,
	// or the VM's cpus when Multiqueue is set.
	Queues     int    `toml:"queues"`
	Multiqueue bool   `toml:"multiqueue"`
	Vhost      string `toml:"vhost"` // tap NICs: "auto" (default: on where /dev/vhost-net exists), "on", "off"
	// RxQueueSize and TxQueueSize size virtio-net's queues (a power of 2,
	// 256..1024, TX at most 256 with vmsup's backends; 0: QEMU's 256); SndBuf bounds the tap's send buffer
	// (tap NICs; 0: the kernel's). tuning.go has their checks.
	RxQueueSize int  `toml:"rx_queue_size"`
	TxQueueSize int  `toml:"tx_queue_size"`
	SndBuf      Size `toml:"sndbuf"`
	// Link is the NIC's link state as the guest sees it: "up" (the default,
	// also when empty) or "down"; it can change while the VM runs.
	Link string `toml:"link"`

	// Network NICs (type "network"): the managed network's name, the
	// guest's IPv4 address (a static DHCP lease; default one vmsup picks
	// and keeps for the NIC), whether the guest may send as other
	// addresses (anti-spoofing is on unless allow_spoofing), and the
	// VM's security groups ([[security_group]]) that filter its traffic.
	Network        string   `toml:"network"`
	IP             string   `toml:"ip"`
	AllowSpoofing  bool     `toml:"allow_spoofing"`
	SecurityGroups []string `toml:"security_groups"`

	// Model is the guest's NIC: "virtio" (virtio-net-pci; the default,
	// also when empty) or "e1000e" (Intel 82574, which Windows' installer
	// drives without the VirtIO drivers; no mtu, no queues).
	Model string `toml:"model"`
}

// NIC models.
const (
	NICModelVirtio = "virtio"
	NICModelE1000e = "e1000e"
)

// Link states.
const (
	LinkUp   = "up"
	LinkDown = "down"
)

// LinkIsUp reports whether the NIC's link is up.
func (n *NIC) LinkIsUp() bool { return n.Link != LinkDown }

// LinkState is the NIC's link as a word: LinkUp or LinkDown.
func (n *NIC) LinkState() string {
	if n.LinkIsUp() {
		return LinkUp
	}
	return LinkDown
}

// IOLimits are a disk's I/O limits; zero is unlimited. A total limit and
// its read/write pair exclude each other (QEMU's rule).
type IOLimits struct {
	IOPS      int  `toml:"iops"`       // operations per second, read and write together
	IOPSRead  int  `toml:"iops_read"`  // read operations per second
	IOPSWrite int  `toml:"iops_write"` // write operations per second
	BPS       Size `toml:"bps"`        // bytes per second, read and write together ("10M")
	BPSRead   Size `toml:"bps_read"`   // read bytes per second
	BPSWrite  Size `toml:"bps_write"`  // written bytes per second
}

// Limited reports whether any limit is set.
func (l IOLimits) Limited() bool { return l != IOLimits{} }

// Limits are the cgroup limits of the VM's unit.
type Limits struct {
	// MemoryOverhead is added to the guest memory to form the unit's MemoryMax.
	// Default 256M (QEMU's own memory with TCG's translation cache, measured).
	MemoryOverhead Size `toml:"memory_overhead"`
	CPUQuota       int  `toml:"cpu_quota"`  // percent of one CPU (200 = two CPUs); 0 = no quota
	CPUWeight      int  `toml:"cpu_weight"` // 1..10000; 0 = systemd default
	TasksMax       int  `toml:"tasks_max"`  // default 4096
}

// Defaults.
const (
	DefaultMachine        = "q35"
	DefaultHotplugSlots   = 8
	DefaultStopTimeout    = 60 * time.Second
	DefaultMemoryOverhead = 256 * MiB
	DefaultTasksMax       = 4096
	MaxNameLen            = 64
	// DefaultCmdlineMax is the kernel command line's limit (x86 Linux
	// takes 2 KiB by default); MaxCmdline is as far as cmdline_max goes.
	// Both are far below what systemd can carry in a unit's properties.
	DefaultCmdlineMax = 4 << 10
	MaxCmdline        = 64 << 10
	MaxStopTimeout    = 24 * time.Hour
)

// Slots returns the number of hotplug root ports.
func (vm *VM) Slots() int {
	if vm.HotplugSlots == nil {
		return 0
	}
	return *vm.HotplugSlots
}

// HasGuestAgent reports whether the guest-agent channel is configured.
func (vm *VM) HasGuestAgent() bool { return vm.GuestAgent == nil || *vm.GuestAgent }

// HasNetworkDisk reports whether a disk is reached over the network (iSCSI,
// RBD): QEMU then needs the host network even without NICs.
func (vm *VM) HasNetworkDisk() bool {
	for _, d := range vm.Disks {
		if d.Type == DiskISCSI || d.Type == DiskRBD {
			return true
		}
	}
	return false
}

// FillDefaults fills the documented defaults of unset keys in place (a VM
// read back from a record written before a key existed).
func (vm *VM) FillDefaults() { vm.applyDefaults() }

// applyDefaults fills the documented defaults in place.
func (vm *VM) applyDefaults() {
	vm.guestDevDefaults()
	vm.displayDefaults()
	if vm.Machine == "" {
		vm.Machine = DefaultMachine
	}
	if vm.Watchdog != "" && vm.WatchdogModel == "" {
		vm.WatchdogModel = WatchdogI6300ESB
	}
	if vm.Accel == "" {
		vm.Accel = AccelAuto
	}
	if vm.CPUs == 0 {
		vm.CPUs = 1
	}
	if vm.MaxCPUs == 0 {
		vm.MaxCPUs = vm.CPUs
	}
	if vm.MaxMemory == 0 {
		vm.MaxMemory = vm.Memory
	}
	if vm.HotplugSlots == nil {
		n := DefaultHotplugSlots
		if !vm.Q35() {
			n = 0
		}
		vm.HotplugSlots = &n
	}
	if vm.StopTimeout == 0 {
		vm.StopTimeout = Duration(DefaultStopTimeout)
	}
	if vm.GuestAgent == nil {
		t := true
		vm.GuestAgent = &t
	}
	if vm.Shutdown == "" {
		vm.Shutdown = ShutdownACPI
	}
	if vm.Boot.Firmware == "" {
		vm.Boot.Firmware = FirmwareBIOS
	}
	for i := range vm.Disks {
		vm.Disks[i].applyDefaults(vm.Name)
	}
	for i := range vm.NICs {
		n := &vm.NICs[i]
		if n.Type == "" {
			n.Type = NICUser
		}
		if n.MAC == "" {
			n.MAC = DeriveMAC(vm.Name, i)
		}
		n.applyDefaults(vm.Name, vm.CPUs)
	}
	for i := range vm.HostDevs {
		vm.HostDevs[i].applyDefaults()
	}
	if vm.Limits.MemoryOverhead == 0 {
		vm.Limits.MemoryOverhead = DefaultMemoryOverhead
	}
	if vm.Limits.TasksMax == 0 {
		vm.Limits.TasksMax = DefaultTasksMax
	}
	vm.Security.applyDefaults()
	vm.applyFailureDefaults()
	vm.applyTopologyDefaults()
	vm.UUID = strings.ToLower(vm.UUID) // one spelling, so a case change is no change
}

// Shutdown methods.
const (
	ShutdownACPI  = "acpi"
	ShutdownAgent = "agent"
)
