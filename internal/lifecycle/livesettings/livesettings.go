// Package livesettings gives a running QEMU the settings it takes over QMP
// only (I/O limits, NIC links, vCPU pinning, the balloon): the start
// pipeline right after QEMU answers, a migration destination before its
// guest runs, and apply when the file changes them.
package livesettings

import (
	"context"
	"fmt"
	"slices"

	"github.com/vmsup/vmsup/internal/host/affinity"
	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Settings QEMU takes over QMP only (a disk's I/O limits, a NIC's link
// state: -blockdev and -device have no option for either; vCPU pinning;
// the balloon): the start pipeline gives them right after QEMU answers
// (its live-settings step), a migration destination before its guest
// runs, and apply when the file changes them. A start records the VM
// without them until they are in force, so that a start killed in between
// leaves a record that says what QEMU has.

// balloonStatsInterval is how often the guest's balloon driver reports its
// memory (seconds), set when QEMU starts: without it there are no figures.
const balloonStatsInterval = 5

// BalloonPath is the QOM path of the balloon device vmsup adds.
const BalloonPath = "/machine/peripheral/balloon"

// HasRuntime reports whether vm has settings only QMP can give.
func HasRuntime(vm *spec.VM) bool {
	return vm.Balloon || len(vm.Pinning.VCPUs) > 0 || slices.ContainsFunc(vm.Disks, func(d spec.Disk) bool { return d.Limited() }) ||
		slices.ContainsFunc(vm.NICs, func(n spec.NIC) bool { return !n.LinkIsUp() })
}

// WithoutRuntime is vm as QEMU runs it before Runtime: no I/O limits,
// every link up, no vCPU pinned.
func WithoutRuntime(vm spec.VM) *spec.VM {
	vm.BalloonTarget = 0
	vm.Pinning.VCPUs = nil
	vm.Disks = slices.Clone(vm.Disks)
	for i := range vm.Disks {
		vm.Disks[i].IOLimits = spec.IOLimits{}
	}
	vm.NICs = slices.Clone(vm.NICs)
	for i := range vm.NICs {
		vm.NICs[i].Link = ""
	}
	return &vm
}

// Runtime gives the running QEMU vm's QMP-only settings. Setting a value
// QEMU already has is harmless, so a recovery can simply run it again.
// qmpPath is the QMP socket of the QEMU c talks to (it finds its threads).
func Runtime(ctx context.Context, c *qmp.Conn, vm *spec.VM, qmpPath string) error {
	if err := PinVCPUs(ctx, c, vm, qmpPath); err != nil {
		return err
	}
	for _, d := range vm.Disks {
		if d.Limited() {
			if err := SetIOLimits(ctx, c, d); err != nil {
				return err
			}
		}
	}
	for _, n := range vm.NICs {
		if !n.LinkIsUp() {
			if err := SetLink(ctx, c, n); err != nil {
				return err
			}
		}
	}
	if vm.Balloon {
		// The guest reports its memory figures (stats) only when asked to.
		if err := c.QOMSet(ctx, BalloonPath, "guest-stats-polling-interval", balloonStatsInterval); err != nil {
			return fmt.Errorf("balloon: guest-stats-polling-interval: %w", err)
		}
	}
	if vm.BalloonTarget != 0 {
		return SetBalloon(ctx, c, vm)
	}
	return nil
}

// PinVCPUs pins each vCPU thread of the QEMU on qmpPath as vm asks.
func PinVCPUs(ctx context.Context, c *qmp.Conn, vm *spec.VM, qmpPath string) error {
	if len(vm.Pinning.VCPUs) == 0 {
		return nil
	}
	pid, err := pinnedQEMU(vm, qmpPath)
	if err != nil {
		return err
	}
	if _, err := affinity.PinVCPUs(ctx, c, pid, vm.Pinning.VCPUs); err != nil {
		return fmt.Errorf("pinning: %w", err)
	}
	return nil
}

// Repin pins the vCPUs as vm now says: to their CPUs, or, without
// pinning.vcpus, back to the unit's CPUs (the host's when it has none).
func Repin(ctx context.Context, c *qmp.Conn, vm *spec.VM, qmpPath string) error {
	if len(vm.Pinning.VCPUs) > 0 {
		return PinVCPUs(ctx, c, vm, qmpPath)
	}
	set := vm.Pinning.EmulatorCPUs()
	if len(set) == 0 {
		var err error
		if set, err = caps.OnlineCPUs(); err != nil {
			return err
		}
	}
	pid, err := pinnedQEMU(vm, qmpPath)
	if err != nil {
		return err
	}
	return affinity.FloatVCPUs(ctx, c, pid, set)
}

// pinnedQEMU is the process whose threads pinning sets: vm's QEMU on
// qmpPath (a migration's other QEMU listens elsewhere).
func pinnedQEMU(vm *spec.VM, qmpPath string) (int, error) {
	if pid := vmstore.QEMUPID(vm.Name, qmpPath); pid > 0 {
		return pid, nil
	}
	return 0, fmt.Errorf("pinning: no QEMU of VM %q on %s in this PID namespace", vm.Name, qmpPath)
}

// SetBalloon gives the balloon its target; none (0) means all of the
// memory the guest has now (boot and DIMMs).
func SetBalloon(ctx context.Context, c *qmp.Conn, vm *spec.VM) error {
	target := int64(vm.BalloonTarget)
	if target == 0 {
		m, err := c.QueryMemorySizeSummary(ctx)
		if err != nil {
			return fmt.Errorf("balloon: %w", err)
		}
		target = int64(m.BaseMemory + m.PluggedMemory)
	}
	if err := c.Balloon(ctx, target); err != nil {
		return fmt.Errorf("balloon: %w", err)
	}
	return nil
}

// SetIOLimits sets (or with none, removes) a disk's I/O limits. QEMU
// wants the device that holds the block backend: for virtio-blk-pci that is
// its virtio-blk child, so it is looked up by the disk's node.
func SetIOLimits(ctx context.Context, c *qmp.Conn, d spec.Disk) error {
	blocks, err := c.QueryBlock(ctx)
	if err != nil {
		return fmt.Errorf("disk %q: query-block: %w", d.Name, err)
	}
	id := ""
	for _, b := range blocks {
		if b.Inserted != nil && b.Inserted.NodeName == qemuargs.DiskNodeName(d.Name) {
			id = b.QdevID
		}
	}
	if id == "" {
		return fmt.Errorf("disk %q: QEMU has no device on node %s", d.Name, qemuargs.DiskNodeName(d.Name))
	}
	l := d.IOLimits
	err = c.BlockSetIOThrottle(ctx, qmp.IOThrottle{ID: id,
		IOPS: int64(l.IOPS), IOPSRead: int64(l.IOPSRead), IOPSWrite: int64(l.IOPSWrite),
		BPS: int64(l.BPS), BPSRead: int64(l.BPSRead), BPSWrite: int64(l.BPSWrite)})
	if err != nil {
		return fmt.Errorf("disk %q: I/O limits (block_set_io_throttle): %w", d.Name, err)
	}
	return nil
}

func SetLink(ctx context.Context, c *qmp.Conn, n spec.NIC) error {
	if err := c.SetLink(ctx, qemuargs.NICDeviceID(n.Name), n.LinkIsUp()); err != nil {
		return fmt.Errorf("nic %q: link %s (set_link): %w", n.Name, n.LinkState(), err)
	}
	return nil
}
