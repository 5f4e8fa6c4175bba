package stats

import "time"

// VM is one VM's statistics at one moment. Counters are cumulative since
// QEMU started, so consumers compute rates from two samples.
type VM struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// Up is true when QEMU answered QMP; when false only Name, State and
	// what the caller could read without QEMU are meaningful.
	Up bool `json:"up"`
	// StartTime is when the QEMU process started (see ProcStartTime).
	StartTime *time.Time `json:"start_time"` // nil: not running
	// Uptime is in seconds, since StartTime.
	Uptime float64 `json:"uptime_seconds"`
	CPU    CPU     `json:"cpu"`
	Memory Memory  `json:"memory"`
	Disks  []Disk  `json:"disks"` // never nil (keys never come and go in JSON)
	NICs   []NIC   `json:"nics"`
}

// CPU is the host CPU time the VM's unit used, all in seconds.
type CPU struct {
	// UsageSeconds, UserSeconds and SystemSeconds come from the unit's
	// cgroup cpu.stat, so they include QEMU's I/O and helper threads, not
	// only the vCPUs.
	UsageSeconds  float64 `json:"usage_seconds"`
	UserSeconds   float64 `json:"user_seconds"`
	SystemSeconds float64 `json:"system_seconds"`
	// DelaySeconds is the time QEMU's threads spent runnable but waiting
	// for a host CPU (/proc/PID/task/*/schedstat, 2nd field): the host-side
	// view of what the guest reports as steal.
	DelaySeconds float64 `json:"delay_seconds"`
	VCPUs        int     `json:"vcpus"`
}

// Memory is in bytes. The guest figures come from virtio-balloon
// statistics and are 0 when unknown (no balloon, or the guest driver has
// not reported yet); BalloonActualBytes is 0 when the VM has no balloon.
type Memory struct {
	// RSSBytes is the unit's cgroup memory.current: QEMU's resident memory
	// plus the page cache and kernel memory charged to the unit.
	RSSBytes            uint64 `json:"rss_bytes"`
	BalloonActualBytes  uint64 `json:"balloon_actual_bytes"`
	GuestTotalBytes     uint64 `json:"guest_total_bytes"`
	GuestFreeBytes      uint64 `json:"guest_free_bytes"`
	GuestAvailableBytes uint64 `json:"guest_available_bytes"`
}

// Disk is one block device's counters as QEMU's query-blockstats reports
// them; times are in seconds.
type Disk struct {
	Name             string  `json:"name"`
	ReadBytes        uint64  `json:"read_bytes"`
	WriteBytes       uint64  `json:"write_bytes"`
	ReadOps          uint64  `json:"read_ops"`
	WriteOps         uint64  `json:"write_ops"`
	FlushOps         uint64  `json:"flush_ops"`
	ReadTimeSeconds  float64 `json:"read_time_seconds"`
	WriteTimeSeconds float64 `json:"write_time_seconds"`
	FlushTimeSeconds float64 `json:"flush_time_seconds"`
	// Stalled: requests are in flight and none has ended for
	// iohealth.DefaultBound (one sample's judgement: iohealth.StalledNow).
	Stalled bool `json:"io_stalled"`
}

// NIC is one network interface's counters from the GUEST's point of view,
// as libvirt's domstats reports them: Rx is what the guest received, which
// is what the host tap transmitted, so TapCounters swaps the tap's rx and
// tx. Name is the guest-side device name, HostIf the tap on the host.
type NIC struct {
	Name      string `json:"name"`
	HostIf    string `json:"host_if"`
	RxBytes   uint64 `json:"rx_bytes"`
	TxBytes   uint64 `json:"tx_bytes"`
	RxPackets uint64 `json:"rx_packets"`
	TxPackets uint64 `json:"tx_packets"`
	RxDropped uint64 `json:"rx_dropped"`
	TxDropped uint64 `json:"tx_dropped"`
}

// Skipped is a VM left out of a scrape, with why (starting, stopping).
type Skipped struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}
