package main

import (
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// statusJSON is status's and ls's VM in --json (docs/cli-json.md).
type statusJSON struct {
	Name          string       `json:"name"`
	State         string       `json:"state"`
	Reason        string       `json:"reason"`
	QEMUStatus    string       `json:"qemu_status"`
	Description   string       `json:"description"`
	Unit          string       `json:"unit"`
	UnitState     string       `json:"unit_state"`
	PID           uint32       `json:"pid"`
	Since         *time.Time   `json:"since"`
	UptimeSeconds int64        `json:"uptime_seconds"`
	Accel         string       `json:"accel"`
	AccelReason   string       `json:"accel_reason"`
	CPUModel      string       `json:"cpu_model"`
	CPUMasks      []string     `json:"cpu_masks"`
	UUID          string       `json:"uuid"`
	CPUs          int          `json:"cpus"`
	Memory        string       `json:"memory"`
	MemoryUsed    uint64       `json:"memory_used_bytes"`
	SpecFile      string       `json:"spec_file"`
	StateDir      string       `json:"state_dir"`
	ConsoleSocket string       `json:"console_socket"`
	ConsoleLog    string       `json:"console_log"`
	Autostart     bool         `json:"autostart"`
	MovedDisks    []string     `json:"moved_disks"` // disks of the file moved by disk move: "NAME: FROM -> TO"
	Disks         []diskJSON   `json:"disks"`
	NICs          []nicJSON    `json:"nics"`
	Agent         *agentJSON   `json:"agent"`
	Confinement   *confineJSON `json:"confinement"`
	Recovery      string       `json:"recovery"`
	Sync          string       `json:"sync"` // "in sync", "changed", "file unreadable", "" (not running)
	Generation    int          `json:"generation"`
	Pending       []string     `json:"pending"`
	PendingReboot bool         `json:"pending_at_reboot"`
}

type diskJSON struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Source     string `json:"source"`
	Format     string `json:"format"`
	ReadOnly   bool   `json:"read_only"`
	Hotplugged bool   `json:"hotplugged"`
	Image      string `json:"image"` // the image QEMU writes: a snapshot's overlay, else source ("" for non-file disks)
}

type nicJSON struct {
	Name       string   `json:"name"`
	Type       string   `json:"type"`
	Link       string   `json:"link"` // up or down, as the guest sees it
	MAC        string   `json:"mac"`
	Tap        string   `json:"tap"`
	TapPresent bool     `json:"tap_present"`
	Bridge     string   `json:"bridge"`
	Forwards   []string `json:"forwards"`
	Addresses  []string `json:"addresses"` // cni: what ADD gave the guest
	Hotplugged bool     `json:"hotplugged"`
	// Network NICs: the managed network and the NIC's filter.
	Network        string   `json:"network,omitempty"`
	AntiSpoofing   bool     `json:"anti_spoofing,omitempty"`
	SecurityGroups []string `json:"security_groups,omitempty"`
}

type agentJSON struct {
	Name       string        `json:"name"`
	Responding bool          `json:"responding"`
	Version    string        `json:"version"`
	OS         string        `json:"os"`
	PingMillis float64       `json:"ping_ms"`
	Error      string        `json:"error"`
	Addresses  []addressJSON `json:"addresses"`
}

type addressJSON struct {
	Interface string `json:"interface"`
	MAC       string `json:"mac"`
	Address   string `json:"address"`
}

type confineJSON struct {
	User     string `json:"user"`
	AppArmor string `json:"apparmor"`
	Seccomp  string `json:"seccomp"`
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func toStatusJSON(s supervisor.Status) statusJSON {
	out := statusJSON{Name: s.Name, State: stateJSON(s.State), Reason: s.Reason, QEMUStatus: s.QEMUStatus,
		Description: s.Description, Unit: s.Unit, UnitState: s.UnitState, PID: s.MainPID, Since: s.Since,
		Accel: string(s.Accel), AccelReason: s.AccelReason, CPUModel: s.CPUModel, CPUMasks: nonNil(s.CPUMasks), UUID: s.UUID,
		CPUs: s.CPUs, Memory: s.Memory, MemoryUsed: s.MemoryUsed, SpecFile: s.SpecFile, StateDir: s.StateDir,
		ConsoleSocket: s.Console, ConsoleLog: s.ConsoleLog, Autostart: s.Autostart, Recovery: s.Recovery,
		Disks: disksJSON(s.Disks), NICs: nicsJSON(s.NICs),
		Sync: s.Sync, Generation: s.Generation, Pending: nonNil(s.Pending), PendingReboot: s.PendingAtReboot,
		MovedDisks: nonNil(s.MovedDisks)}
	if s.Since != nil && (s.State == supervisor.StateRunning || s.State == supervisor.StatePaused) {
		out.UptimeSeconds = int64(time.Since(*s.Since).Seconds())
	}
	if s.GuestAgent != nil {
		a := toAgentJSON(s.Name, *s.GuestAgent)
		out.Agent = &a
	}
	if c := s.Confinement; c != nil {
		out.Confinement = &confineJSON{User: c.User, AppArmor: c.AppArmor, Seccomp: c.Seccomp}
	}
	return out
}

func disksJSON(ds []supervisor.DiskInfo) []diskJSON {
	out := []diskJSON{}
	for _, d := range ds {
		out = append(out, diskJSON{Name: d.Name, Type: d.Type, Source: d.Source, Format: d.Format, ReadOnly: d.ReadOnly, Hotplugged: d.Hotplugged, Image: d.Image})
	}
	return out
}

func nicsJSON(ns []supervisor.NICInfo) []nicJSON {
	out := []nicJSON{}
	for _, n := range ns {
		out = append(out, nicJSON{Name: n.Name, Type: n.Type, Link: n.Link, MAC: n.MAC, Tap: n.Tap, TapPresent: n.TapUp, Bridge: n.Bridge,
			Forwards: nonNil(n.Forwards), Addresses: nonNil(n.Addrs), Hotplugged: n.Hotplug,
			Network: n.Network, AntiSpoofing: n.AntiSpoofing, SecurityGroups: n.SecurityGroups})
	}
	return out
}

func toAgentJSON(name string, a supervisor.AgentStatus) agentJSON {
	out := agentJSON{Name: name, Responding: a.Responding, Version: a.Version, OS: a.OS, PingMillis: a.PingMillis, Error: a.Error, Addresses: []addressJSON{}}
	for _, ad := range a.Addresses {
		out.Addresses = append(out.Addresses, addressJSON{Interface: ad.Interface, MAC: ad.MAC, Address: ad.Address})
	}
	return out
}

// resizeJSON is set's result in --json.
type resizeJSON struct {
	Name      string `json:"name"`
	CPUs      int    `json:"cpus"`
	MaxCPUs   int    `json:"max_cpus"`
	Memory    string `json:"memory"`
	MaxMemory string `json:"max_memory"`
	Note      string `json:"note"`
}
