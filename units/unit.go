package units

import (
	"fmt"
	"strings"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Unit describes one transient service.
type Unit struct {
	Name        string // e.g. "vmsup-web.service"
	Description string
	Slice       string   // e.g. "vmsup.slice"; "" = systemd's default
	Argv        []string // main process; its failure is never ignored
	// ExecStop runs on "systemctl stop" while the main process lives; it is
	// where the graceful guest shutdown belongs. ExecStopPost always runs.
	ExecStop     [][]string
	ExecStopPost [][]string
	// StopHooksPrivileged runs ExecStop and ExecStopPost with full
	// privileges while the service itself runs as Sandbox.User: vmsup's
	// hooks talk QMP as vmsup does, and clean-up that takes back ACLs,
	// profiles or taps needs root. It is PermissionsStartOnly=, not the
	// "+" prefix: systemd 252 writes a "+" command into the unit's
	// transient file as ExecStopEx=/ExecStopPostEx=, keys its own parser
	// does not know, so a daemon-reload dropped both hooks ("Unknown key
	// 'ExecStopPostEx'", measured; TestReloadKeepsProperties).
	StopHooksPrivileged bool
	TimeoutStop         time.Duration // outer bound for ExecStop + the stop signal
	// After orders the unit after these: at start, if they start in the same
	// transaction (boot); at shutdown the unit stops first, so what the VM
	// needs (the network, Open vSwitch) outlives its graceful stop.
	After []string
	// Before orders the unit before these: at shutdown it stops after
	// them (a VM's console logger outlives its QEMU's last words).
	Before      []string
	Environment []string // "K=V"
	WorkingDir  string
	// WorkingDirOptional: a WorkingDir that is missing or cannot be
	// entered leaves the processes in "/" rather than failing them (the
	// "-" prefix), so the stop hooks run whatever became of it.
	WorkingDirOptional bool
	UMask              uint32 // 0 = systemd's default (0022)
	// Collect: the unit goes as soon as it ends, failed or not (a helper
	// whose result nobody reads; VMs keep theirs until vmsup resets it).
	Collect bool

	MemoryMax uint64 // bytes; 0 = no limit
	// CPUAccounting keeps the unit's CPU time (CPUUsageNSec), for stats.
	CPUAccounting bool
	CPUQuota      int // percent of one CPU; 0 = none
	CPUWeight     int // 0 = default
	// CPUAffinity is the host CPUs the unit's processes may run on (the
	// threads inherit it); empty = all.
	CPUAffinity []int
	TasksMax    int // 0 = default
	// MemLock is LimitMEMLOCK= (soft and hard), bytes; 0 = systemd's
	// default. VFIO pins all guest memory, charged to QEMU's user.
	MemLock     uint64
	DeviceAll   bool // true = DevicePolicy=auto; false = closed + DeviceAllow
	DeviceAllow []DeviceRule

	// NetworkNamespacePath puts every process of the unit (QEMU and its
	// stop hooks) in the network namespace bind-mounted there.
	NetworkNamespacePath string
	// Sandbox, when set, confines the service (see Sandbox); its Devices
	// are added to DeviceAllow.
	Sandbox *Sandbox
	// FIFOSockets are started with the unit, before it, and end with it
	// (see FIFOSocket).
	FIFOSockets []FIFOSocket
}

// DeviceRule allows one device node ("/dev/kvm", "rw").
type DeviceRule struct{ Path, Access string }

func (u Unit) properties() ([]sd.Property, error) {
	if u.Name == "" || !strings.HasSuffix(u.Name, ".service") {
		return nil, fmt.Errorf("unit name %q must end in .service", u.Name)
	}
	if len(u.Argv) == 0 {
		return nil, fmt.Errorf("unit %s: empty command", u.Name)
	}
	p := append(u.lifecycleProps(), u.resourceProps()...)
	p = append(p, u.socketDeps()...)
	devices := u.DeviceAllow
	if u.Sandbox != nil {
		sp, err := u.Sandbox.properties(&u)
		if err != nil {
			return nil, err
		}
		p = append(p, sp...)
		devices = append(append([]DeviceRule(nil), devices...), u.Sandbox.Devices...)
	}
	if !u.DeviceAll {
		p = append(p, prop("DevicePolicy", "closed"))
		type rule struct{ Path, Access string }
		rules := make([]rule, 0, len(devices))
		for _, r := range devices {
			rules = append(rules, rule(r))
		}
		p = append(p, prop("DeviceAllow", rules))
	}
	return p, nil
}

// lifecycleProps: the command, how it starts, stops and is collected,
// its order and process environment.
func (u Unit) lifecycleProps() []sd.Property {
	p := []sd.Property{
		sd.PropDescription(u.Description),
		// false: a QEMU that exits non-zero must make the unit fail (the
		// go-systemd flag is "ignore failure", the "-" prefix).
		sd.PropExecStart(u.Argv, false),
		prop("Type", "exec"),
		prop("KillMode", "mixed"),
		prop("Restart", "no"),
	}
	if u.Collect {
		p = append(p, prop("CollectMode", "inactive-or-failed"))
	} else {
		// Keep a failed unit (and its exit reason) until vmsup resets it.
		p = append(p, prop("CollectMode", "inactive"))
	}
	if u.Slice != "" {
		p = append(p, sd.PropSlice(u.Slice))
	}
	if len(u.Before) > 0 {
		p = append(p, sd.PropBefore(u.Before...))
	}
	if len(u.After) > 0 {
		p = append(p, sd.PropAfter(u.After...))
	}
	// Only the plain forms: systemd 252 re-reads a transient unit from
	// the file it wrote at start on every daemon-reload, and writes the Ex
	// forms under keys it cannot read back.
	if len(u.ExecStop) > 0 {
		p = append(p, execProp("ExecStop", u.ExecStop))
	}
	if len(u.ExecStopPost) > 0 {
		p = append(p, execProp("ExecStopPost", u.ExecStopPost))
	}
	if u.StopHooksPrivileged {
		p = append(p, prop("PermissionsStartOnly", true))
	}
	if u.TimeoutStop > 0 {
		p = append(p, prop("TimeoutStopUSec", uint64(u.TimeoutStop/time.Microsecond)))
	}
	if len(u.Environment) > 0 {
		p = append(p, prop("Environment", u.Environment))
	}
	if u.WorkingDir != "" {
		wd := u.WorkingDir
		if u.WorkingDirOptional {
			wd = "-" + wd
		}
		p = append(p, prop("WorkingDirectory", wd))
	}
	if u.UMask != 0 {
		p = append(p, prop("UMask", u.UMask))
	}
	if u.NetworkNamespacePath != "" {
		p = append(p, prop("NetworkNamespacePath", u.NetworkNamespacePath))
	}
	return p
}

// resourceProps: the cgroup limits and accounting, CPU affinity, locked
// memory.
func (u Unit) resourceProps() []sd.Property {
	var p []sd.Property
	if u.MemoryMax > 0 {
		p = append(p, prop("MemoryAccounting", true), prop("MemoryMax", u.MemoryMax))
	}
	if u.CPUQuota > 0 || u.CPUAccounting {
		p = append(p, prop("CPUAccounting", true))
	}
	if u.CPUQuota > 0 {
		p = append(p, prop("CPUQuotaPerSecUSec", uint64(u.CPUQuota)*10000))
	}
	if u.CPUWeight > 0 {
		p = append(p, prop("CPUWeight", uint64(u.CPUWeight)))
	}
	if len(u.CPUAffinity) > 0 {
		p = append(p, prop("CPUAffinity", cpuMask(u.CPUAffinity)))
	}
	if u.TasksMax > 0 {
		p = append(p, prop("TasksAccounting", true), prop("TasksMax", uint64(u.TasksMax)))
	}
	if u.MemLock > 0 {
		p = append(p, prop("LimitMEMLOCK", u.MemLock), prop("LimitMEMLOCKSoft", u.MemLock))
	}
	return p
}

func prop(name string, v any) sd.Property {
	return sd.Property{Name: name, Value: godbus.MakeVariant(v)}
}

// execCommand is systemd's (sasb) ExecStart-style tuple.
type execCommand struct {
	Path          string
	Args          []string
	IgnoreFailure bool
}

func execProp(name string, cmds [][]string) sd.Property {
	v := make([]execCommand, 0, len(cmds))
	for _, c := range cmds {
		v = append(v, execCommand{Path: c[0], Args: c})
	}
	return prop(name, v)
}

// cpuMask is a CPU set as systemd's CPUAffinity= bytes: bit N of byte N/8.
func cpuMask(cpus []int) []byte {
	var b []byte
	for _, c := range cpus {
		for len(b) <= c/8 {
			b = append(b, 0)
		}
		b[c/8] |= 1 << (c % 8)
	}
	return b
}
