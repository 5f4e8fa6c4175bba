// Package plan compares a VM's file with the VM as it runs and says, for
// each difference, how it can reach the running VM: live (and by which QMP
// command or unit property), at the guest's next reboot, by a restart, or
// not at all. It is pure: the supervisor gives it the two specs and a few
// facts about the running QEMU, and applies what it returns.
package plan

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Class says how a change reaches the running VM.
type Class string

// Classes, from the cheapest to the impossible.
const (
	// Live: applied to the running VM now, over QMP or as a unit property.
	Live Class = "live"
	// Reboot: needs a new QEMU, and matters only when the guest boots:
	// applied when the guest reboots by itself (QEMU is restarted then).
	Reboot Class = "reboot"
	// Restart: needs a new QEMU; apply --restart does it now (health-gated),
	// apply --at-next-reboot at the guest's own reboot.
	Restart Class = "restart"
	// Impossible: cannot be applied to this VM at all; apply refuses the
	// whole file.
	Impossible Class = "impossible"
)

// Kind is what apply does for a live change.
type Kind string

// Live change kinds.
const (
	DiskAdd     Kind = "disk-add"
	DiskRemove  Kind = "disk-remove"
	DiskLimits  Kind = "disk-limits"
	DiskMedium  Kind = "disk-medium"
	DiskGrow    Kind = "disk-grow"
	NICAdd      Kind = "nic-add"
	NICRemove   Kind = "nic-remove"
	NICLink     Kind = "nic-link"
	CPUs        Kind = "cpus"
	Memory      Kind = "memory"
	UnitLimits  Kind = "unit-limits"
	Balloon     Kind = "balloon"
	Autostart   Kind = "autostart"
	Pinning     Kind = "pinning"
	NICFilter   Kind = "nic-filter" // security groups and anti-spoofing of network NICs (nftables)
	RecordOnly  Kind = "record"     // a setting vmsup reads from its record (description, health)
	NotLiveKind Kind = ""
)

// Change is one difference between the file and the running VM.
type Change struct {
	Field string `json:"field"` // spec field: "cpus", "disk[data].iops", "nic[lan]"
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	Class Class  `json:"class"`
	Kind  Kind   `json:"kind,omitempty"` // live changes: what apply does
	Name  string `json:"name,omitempty"` // the disk or NIC the change is about
	// Op is how it is applied: the QMP command or unit property (live), or
	// what a new QEMU does.
	Op string `json:"op,omitempty"`
	// Why a change is not live.
	Why string `json:"why,omitempty"`
	// Guest is what the guest must do for the change to take effect.
	Guest string `json:"guest,omitempty"`
	// Warn is what the guest will notice beyond the change itself.
	Warn string `json:"warn,omitempty"`
}

func (c Change) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s %s", c.Class, c.Field)
	if c.From != "" || c.To != "" {
		fmt.Fprintf(&b, ": %s -> %s", orNone(c.From), orNone(c.To))
	}
	if c.Op != "" {
		fmt.Fprintf(&b, " (%s)", c.Op)
	}
	if c.Why != "" {
		fmt.Fprintf(&b, "; not live: %s", c.Why)
	}
	if c.Guest != "" {
		fmt.Fprintf(&b, "; guest: %s", c.Guest)
	}
	if c.Warn != "" {
		fmt.Fprintf(&b, "; warning: %s", c.Warn)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Facts are what the running QEMU allows beyond its spec.
type Facts struct {
	// SpareSlots is how many devices can still be hot-plugged (free root
	// ports on q35; pc hotplugs onto its root bus).
	SpareSlots int
	// BootMemory is the memory the running QEMU booted with: memory can
	// shrink live only back to it (by unplugging DIMMs added since).
	BootMemory spec.Size
	// Kept are disks and NICs attached by hand (vmsup disk/nic attach)
	// that the file does not have: not the file's business, left alone.
	KeptDisks, KeptNICs []string
	// NotLive are new disks of the file that the running VM cannot open
	// (by name: why), found by the same checks a hot-plug makes: their
	// addition needs a restart.
	NotLive map[string]string
	// TapsNotLive says why the running VM cannot take a NIC on a host tap
	// ("" when it can): such a NIC's addition needs a restart.
	TapsNotLive string
	// Snapshotted are the disks in snapshots (by name: why they cannot
	// grow): their file is a snapshot's frozen image.
	Snapshotted map[string]string
}

// Diff lists what differs between running and desired, in a stable order:
// removals first (they free slots), then additions, then the rest by
// field. running is the VM as it runs (its record, with live resizes);
// both have their defaults filled.
func Diff(running, desired *spec.VM, f Facts) []Change {
	d := &differ{facts: f, slots: f.SpareSlots}
	d.devices(running, desired)
	d.resources(running, desired)
	d.fields("", reflect.ValueOf(*running), reflect.ValueOf(*desired))
	if !running.Balloon {
		for i, c := range d.out {
			if c.Kind == Balloon {
				d.out[i].Class, d.out[i].Kind, d.out[i].Op = Restart, NotLiveKind, ""
				d.out[i].Why = "the VM runs without a balloon device"
			}
		}
	}
	slices.SortStableFunc(d.out, func(a, b Change) int { return order(a) - order(b) })
	return d.out
}

// order puts removals first and additions second; the rest keep field order.
func order(c Change) int {
	switch c.Kind {
	case DiskRemove, NICRemove:
		return 0
	case DiskAdd, NICAdd:
		return 1
	}
	return 2
}

// Blocking returns the changes that make the file impossible to apply.
func Blocking(cs []Change) []Change {
	return slices.DeleteFunc(slices.Clone(cs), func(c Change) bool { return c.Class != Impossible })
}

// Only returns the changes of one class.
func Only(cs []Change, class Class) []Change {
	return slices.DeleteFunc(slices.Clone(cs), func(c Change) bool { return c.Class != class })
}

type differ struct {
	facts Facts
	slots int // spare slots left after the additions planned so far
	out   []Change
}

func (d *differ) add(c Change) { d.out = append(d.out, c) }
