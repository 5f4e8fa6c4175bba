package libvirtimport

import "github.com/vmsup/vmsup/spec"

// The VM file Convert writes: the spec's keys, each left out when it has
// its default, so the file says only what the domain asked for.

type fileVM struct {
	Name          string            `toml:"name"`
	Description   string            `toml:"description,omitempty"`
	UUID          string            `toml:"uuid,omitempty"`
	RTC           string            `toml:"rtc,omitempty"`
	Machine       string            `toml:"machine,omitempty"`
	CPUModel      string            `toml:"cpu_model,omitempty"`
	CPUs          uint              `toml:"cpus,omitempty"`
	MaxCPUs       uint              `toml:"max_cpus,omitempty"`
	Memory        string            `toml:"memory"`
	MaxMemory     string            `toml:"max_memory,omitempty"`
	Hugepages     string            `toml:"hugepages,omitempty"`
	IOThreads     int               `toml:"iothreads,omitempty"`
	GuestAgent    *bool             `toml:"guest_agent,omitempty"`
	Balloon       bool              `toml:"balloon,omitempty"`
	BalloonTarget string            `toml:"balloon_target,omitempty"`
	RNG           *bool             `toml:"rng,omitempty"`
	RNGRate       *fileRNGRate      `toml:"rng_rate,omitempty"`
	VMCoreInfo    *bool             `toml:"vmcoreinfo,omitempty"`
	VMGenID       bool              `toml:"vmgenid,omitempty"`
	OnPanic       string            `toml:"on_panic,omitempty"`
	Watchdog      string            `toml:"watchdog,omitempty"`
	WatchdogModel string            `toml:"watchdog_model,omitempty"`
	Topology      *fileTopology     `toml:"topology,omitempty"`
	Pinning       *filePinning      `toml:"pinning,omitempty"`
	NUMA          []fileNUMA        `toml:"numa,omitempty"`
	Boot          *fileBoot         `toml:"boot,omitempty"`
	Limits        *fileLimits       `toml:"limits,omitempty"`
	SMBIOS        *fileSMBIOS       `toml:"smbios,omitempty"`
	Credentials   map[string]string `toml:"credentials,omitempty"`
	Disks         []fileDisk        `toml:"disk,omitempty"`
	NICs          []fileNIC         `toml:"nic,omitempty"`
	HostDevs      []fileHostDev     `toml:"hostdev,omitempty"`
	TPM           *fileTPM          `toml:"tpm,omitempty"`
	Shares        []fileShare       `toml:"share,omitempty"`
	Vsock         *fileVsock        `toml:"vsock,omitempty"`
	SEV           *fileSEV          `toml:"sev,omitempty"`
	CPU           *fileCPU          `toml:"cpu,omitempty"`     // display.go
	Display       *fileDisplay      `toml:"display,omitempty"` // display.go
}

type fileRNGRate struct {
	Bytes  uint   `toml:"bytes"`
	Period string `toml:"period,omitempty"`
}

type fileSEV struct {
	Policy          uint `toml:"policy"`
	CBitPos         uint `toml:"cbitpos"`
	ReducedPhysBits uint `toml:"reduced_phys_bits"`
}

type fileHostDev struct {
	Address string `toml:"address"`
	ROMBar  *bool  `toml:"rom_bar,omitempty"`
	el      string // the domain element it came from (repair's lines)
}

type fileBoot struct {
	Firmware string `toml:"firmware,omitempty"`
	Kernel   string `toml:"kernel,omitempty"`
	Initrd   string `toml:"initrd,omitempty"`
	Cmdline  string `toml:"cmdline,omitempty"`
	Strict   *bool  `toml:"strict,omitempty"`
	// Secure Boot: libvirt's secure loader, its variable store's template.
	SecureBoot   bool   `toml:"secure_boot,omitempty"`
	VarsTemplate string `toml:"vars_template,omitempty"`
}

type fileLimits struct {
	CPUQuota int `toml:"cpu_quota,omitempty"`
}

type fileSMBIOS struct {
	Manufacturer string   `toml:"manufacturer,omitempty"`
	Product      string   `toml:"product,omitempty"`
	Version      string   `toml:"version,omitempty"`
	Serial       string   `toml:"serial,omitempty"`
	SKU          string   `toml:"sku,omitempty"`
	Family       string   `toml:"family,omitempty"`
	OEMStrings   []string `toml:"oem_strings,omitempty"`
}

type fileDisk struct {
	Name      string `toml:"name"`
	Type      string `toml:"type,omitempty"`
	File      string `toml:"file,omitempty"`
	Format    string `toml:"format,omitempty"`
	Bus       string `toml:"bus,omitempty"`
	Device    string `toml:"device,omitempty"`
	ReadOnly  bool   `toml:"read_only,omitempty"`
	Cache     string `toml:"cache,omitempty"`
	AIO       string `toml:"aio,omitempty"`
	Discard   bool   `toml:"discard,omitempty"`
	Serial    string `toml:"serial,omitempty"`
	BootIndex uint   `toml:"boot_index,omitempty"`
	IOThread  bool   `toml:"iothread,omitempty"`

	IOThreadID  int                   `toml:"iothread_id,omitempty"`
	IOThreadMap []spec.IOThreadQueues `toml:"iothread_map,omitempty"`
	Queues      uint                  `toml:"queues,omitempty"`
	QueueSize   uint                  `toml:"queue_size,omitempty"`
	EventIdx    *bool                 `toml:"event_idx,omitempty"`

	IOPS      uint64 `toml:"iops,omitempty"`
	IOPSRead  uint64 `toml:"iops_read,omitempty"`
	IOPSWrite uint64 `toml:"iops_write,omitempty"`
	BPS       uint64 `toml:"bps,omitempty"`
	BPSRead   uint64 `toml:"bps_read,omitempty"`
	BPSWrite  uint64 `toml:"bps_write,omitempty"`

	Portal        string `toml:"portal,omitempty"`
	Target        string `toml:"target,omitempty"`
	LUN           uint64 `toml:"lun,omitempty"`
	InitiatorName string `toml:"initiator_name,omitempty"`
	Transport     string `toml:"transport,omitempty"`

	Pool      string   `toml:"pool,omitempty"`
	Namespace string   `toml:"namespace,omitempty"`
	Image     string   `toml:"image,omitempty"`
	Snapshot  string   `toml:"snapshot,omitempty"`
	Monitors  []string `toml:"monitors,omitempty"`
	CephConf  string   `toml:"ceph_conf,omitempty"`

	User       string `toml:"user,omitempty"`
	SecretFile string `toml:"secret_file,omitempty"`

	el string // the domain element it came from (repair's lines)
}

type fileNIC struct {
	Name   string `toml:"name"`
	Type   string `toml:"type,omitempty"`
	MAC    string `toml:"mac,omitempty"`
	Bridge string `toml:"bridge,omitempty"`
	// Network and IP: a NIC on a vmsup managed network (type "network").
	Network string `toml:"network,omitempty"`
	IP      string `toml:"ip,omitempty"`
	Tap     string `toml:"tap,omitempty"`
	MTU     uint   `toml:"mtu,omitempty"`
	Queues  uint   `toml:"queues,omitempty"`
	Vhost   string `toml:"vhost,omitempty"`
	Link    string `toml:"link,omitempty"`

	RxQueueSize uint `toml:"rx_queue_size,omitempty"`
	TxQueueSize uint `toml:"tx_queue_size,omitempty"`
	SndBuf      uint `toml:"sndbuf,omitempty"`

	el string // the domain element it came from (repair's lines)
}

type fileTopology struct {
	Sockets int `toml:"sockets"`
	Dies    int `toml:"dies,omitempty"`
	Cores   int `toml:"cores"`
	Threads int `toml:"threads"`
}

type filePinning struct {
	VCPUs    []int  `toml:"vcpus,omitempty"`
	Emulator string `toml:"emulator,omitempty"`
}

type fileNUMA struct {
	CPUs   string `toml:"cpus"`
	Memory string `toml:"memory"`
	el     string // the domain element it came from (repair's lines)
}
