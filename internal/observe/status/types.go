package status

import (
	"net/netip"
	"time"

	"github.com/vmsup/vmsup/internal/host/ovmfvars"
	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/guestagent"
	vmnet "github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// State is a VM's state as vmsup reports it (vmstore.State).
type State = vmstore.State

// VM states (vmstore's).
const (
	StateRunning  = vmstore.StateRunning
	StatePaused   = vmstore.StatePaused
	StateShutOff  = vmstore.StateShutOff
	StateCrashed  = vmstore.StateCrashed
	StateStarting = vmstore.StateStarting
	StateStopping = vmstore.StateStopping
	StateUnknown  = vmstore.StateUnknown
	StatePanicked = vmstore.StatePanicked
)

// Status is what vmsup knows about one VM.
type Status struct {
	Name       string     `json:"name"`
	State      State      `json:"state"`
	Reason     string     `json:"reason,omitempty"` // why crashed/unknown
	QEMUStatus string     `json:"qemu_status,omitempty"`
	Unit       string     `json:"unit"`
	UnitState  string     `json:"unit_state,omitempty"` // ActiveState/SubState
	MainPID    uint32     `json:"main_pid,omitempty"`
	Since      *time.Time `json:"since,omitempty"`
	// UptimeSeconds is how long the running (or paused) VM's unit has
	// been up, when the status was read.
	UptimeSeconds int64      `json:"uptime_seconds,omitempty"`
	Accel         spec.Accel `json:"accel,omitempty"`
	AccelReason   string     `json:"accel_reason,omitempty"`
	// CPUModel is the -cpu model the VM runs with; CPUMasks the features
	// turned off because this host's KVM refuses the model otherwise.
	CPUModel string   `json:"cpu_model,omitempty"`
	CPUMasks []string `json:"cpu_masks,omitempty"`
	UUID     string   `json:"uuid,omitempty"`      // the machine UUID the guest sees (recorded at its first start)
	VsockCID uint32   `json:"vsock_cid,omitempty"` // the guest's vsock CID ([vsock]), kept until rm
	// SecureBoot is what a UEFI VM's own variable store holds: whether
	// Secure Boot is enforced, the enrolled keys' certificates, and a
	// warning (a db with only Microsoft's expired 2011 CAs).
	SecureBoot *SecureBootStatus `json:"secure_boot,omitempty"`
	// HostDevs are the host PCI devices passed through: the file's, and
	// those hot-plugged into this run.
	HostDevs []HostDevInfo `json:"host_devices,omitempty"`
	// Snapshots are the VM's snapshot tags, oldest first; CurrentSnapshot
	// the one its state grew from (vmsup snapshot ls shows the tree).
	Snapshots       []string `json:"snapshots,omitempty"`
	CurrentSnapshot string   `json:"current_snapshot,omitempty"`
	SpecFile        string   `json:"spec_file,omitempty"`
	CPUs            int      `json:"cpus,omitempty"`
	Memory          string   `json:"memory,omitempty"`
	MemoryUsed      uint64   `json:"memory_used_bytes,omitempty"` // the unit's cgroup
	StateDir        string   `json:"state_dir"`
	Console         string   `json:"console_socket"`
	ConsoleLog      string   `json:"console_log"` // everything the guest printed on its serial console
	Description     string   `json:"description"`
	// Disks and NICs: boot-time and hot-plugged, NICs with the host side
	// of their taps.
	Disks []DiskInfo `json:"disks"`
	NICs  []NICInfo  `json:"nics"`
	// Confinement in force while QEMU runs (user, AppArmor, seccomp, exposure).
	Confinement *confine.Status `json:"confinement,omitempty"`
	// AttachedDisks are the disks added with `vmsup disk attach` (beyond the
	// VM's file); the next up boots with them.
	AttachedDisks []string `json:"attached_disks,omitempty"`
	// MovedDisks are the disks of the VM's file that `vmsup disk move` put
	// elsewhere ("data: /old.raw -> /new.qcow2"): the VM boots from the new
	// place while its file still names the old one.
	MovedDisks []string `json:"moved_disks,omitempty"`
	// Autostart: enabled to start at boot (vmsup enable).
	Autostart bool `json:"autostart,omitempty"`
	// Recovery: what this status did about an operation a killed command
	// left unfinished (or why it could not).
	Recovery string `json:"recovery,omitempty"`
	// GuestAgent: the guest ping (running VMs with an agent channel; in
	// List only when the agent answers).
	GuestAgent *guestagent.AgentStatus `json:"guest_agent,omitempty"`
	// DiskIO is what one sample of the running VM's disk I/O shows
	// (detail only): "ok", or "stalled: ..." (requests in flight, none
	// ended for 5 s) or "failing: ...", naming the disk.
	DiskIO string `json:"disk_io,omitempty"`
	// Sync says whether the running VM matches its file: "in sync",
	// "changed" (vmsup plan FILE says how), or "file unreadable".
	Sync string `json:"sync,omitempty"`
	// Generation counts the specs the VM was recorded with (each start and
	// each apply that changed it).
	Generation int `json:"generation,omitempty"`
	// Pending are the changes an apply left for a restart or, with
	// PendingAtReboot, for the guest's next reboot.
	Pending         []string `json:"pending,omitempty"`
	PendingAtReboot bool     `json:"pending_at_reboot,omitempty"`
}

// IPv4 are the guest's IPv4 addresses as "ADDRESS (WHERE)", each as its
// source writes it (with its prefix length or without): those its
// agent reports (WHERE its interface), then those the host gave its NICs
// that the agent did not report (a managed network's lease, a CNI
// result; WHERE the NIC), so a guest whose agent did not answer (none,
// not up yet, slow) still shows the address the host knows.
func (s Status) IPv4() []string { return s.addrs(netip.Addr.Is4) }

// IPv6 are the guest's global IPv6 addresses (link-local ones left out)
// as IPv4 lists the IPv4 ones: its agent's, then those the host gave its
// NICs (a managed network's SLAAC address, a CNI result).
func (s Status) IPv6() []string {
	return s.addrs(func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && a.IsGlobalUnicast() })
}

// addrs are the guest's addresses of which keep holds, as IPv4 says.
func (s Status) addrs(keep func(netip.Addr) bool) []string {
	var out []string
	seen := map[netip.Addr]bool{}
	add := func(addr, where string) {
		a, err := netip.ParseAddr(addr)
		if p, perr := netip.ParsePrefix(addr); perr == nil {
			a, err = p.Addr(), nil
		}
		if err != nil || !keep(a) || seen[a] {
			return
		}
		seen[a] = true
		out = append(out, addr+" ("+where+")")
	}
	if s.GuestAgent != nil {
		for _, a := range s.GuestAgent.Addresses {
			add(a.Address, a.Interface)
		}
	}
	for _, n := range s.NICs {
		for _, a := range n.Addrs {
			add(a, "nic "+n.Name)
		}
	}
	return out
}

// Sync states.
const (
	SyncInSync   = "in sync"
	SyncChanged  = "changed"
	SyncNoFile   = "file unreadable"
	syncNotKnown = ""
)

// SecureBootStatus is a UEFI VM's variable store as Status shows it.
type SecureBootStatus struct {
	ovmfvars.Store
	Warning string `json:"warning,omitempty"`
	Err     string `json:"error,omitempty"` // the store could not be read
}

// HostDevInfo is one host PCI device of a VM; Attached: hot-plugged.
type HostDevInfo struct {
	Address  string `json:"address"`
	Name     string `json:"name"`
	Attached bool   `json:"attached,omitempty"`
}

// DiskInfo is one of the VM's disks, as status and disk ls show it.
type DiskInfo struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Source     string `json:"source"` // the image or device path, iscsi://PORTAL/TARGET/LUN or rbd:POOL/IMAGE
	Format     string `json:"format"`
	ReadOnly   bool   `json:"read_only"`
	Hotplugged bool   `json:"hotplugged"` // added with vmsup disk attach
	// Image is the image QEMU writes for a file disk: a snapshot's
	// overlay on Source when the VM runs on one, else Source itself.
	Image string `json:"image,omitempty"`
	// IOLimits are the disk's I/O limits as the VM runs with them
	// ("iops=500,bps=1048576"; plan.IOLimits), "" when unlimited.
	IOLimits string `json:"io_limits,omitempty"`
}

// NICInfo is one of the VM's NICs: the spec's side (MAC, forwards) and,
// for tap NICs, the host side now (vmnet.NICStatus).
type NICInfo struct {
	vmnet.NICStatus
	// Link is "up" or "down": the link state the guest sees (the spec's
	// link, which QEMU is given with set_link).
	Link     string   `json:"link"`
	MAC      string   `json:"mac"`
	Forwards []string `json:"forwards"`
}
