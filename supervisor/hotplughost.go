package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/ops/hotplug"
	"github.com/vmsup/vmsup/spec"
)

// Hot-plugging disks, NICs and host devices lives in internal/ops/hotplug: one
// attach, one detach and one recovery for every kind of device. These are
// the supervisor's API onto it.

// AttachResult reports a hot-plugged disk.
type AttachResult = hotplug.AttachResult

// AttachDisk hot-plugs d into the running VM name: the same checks and host
// preparation as at boot, then over QMP the disk's objects (secret,
// iothread), its block nodes and its device(s) into a free hotplug root
// port, built by qemuargs.Disk exactly as at boot. Whatever was added is
// removed again if a later part fails. The applied state records the disk,
// so status lists it and the next up boots with it. For a VM that is shut
// off, the disk is checked and only recorded.
func (s *Supervisor) AttachDisk(ctx context.Context, name string, d spec.Disk) (AttachResult, error) {
	return s.hotplug().AttachDisk(ctx, name, d, false)
}

// DetachDisk hot-unplugs a disk attached with AttachDisk: device_del, wait
// for DEVICE_DELETED, then blockdev-del of its nodes and object-del of its
// objects. A guest that does not release the device within
// Options.UnplugTimeout leaves the disk attached and gets an error saying
// so; a later DetachDisk finishes the job once the guest let go.
func (s *Supervisor) DetachDisk(ctx context.Context, name, disk string) error {
	return s.hotplug().DetachDisk(ctx, name, disk, false)
}

// AttachNIC hot-plugs n into the running VM: the host side exactly as at
// boot, then netdev_add and device_add with the values qemuargs renders for
// the command line, into a free spare root port. Defaults are filled as for
// a NIC in the file, but the MAC (spec.AllocMAC): from the VM's and the
// NIC's names, never one of the VM's other NICs. The NIC is recorded in
// state.json (AttachedNICs) and net.json, so detach, down and the stop hook
// remove it. On failure every step is undone.
func (s *Supervisor) AttachNIC(ctx context.Context, name string, n spec.NIC) (spec.NIC, error) {
	return s.hotplug().AttachNIC(ctx, name, n, false)
}

// DetachNIC unplugs a hot-plugged NIC: device_del, wait for the guest to
// release it (DEVICE_DELETED), netdev_del, then the host side goes. NICs the
// VM booted with stay: they are part of its file.
func (s *Supervisor) DetachNIC(ctx context.Context, name, nic string) error {
	return s.hotplug().DetachNIC(ctx, name, nic, false)
}

// AttachHostDev passes the host PCI device h through to the running VM,
// live only: it is given back when QEMU ends (a device the VM should boot
// with goes in its file's [[hostdev]]).
func (s *Supervisor) AttachHostDev(ctx context.Context, name string, h spec.HostDev) error {
	return s.hotplug().AttachHostDev(ctx, name, h)
}

// DetachHostDev unplugs a host device hot-plugged with AttachHostDev (by
// address or name) and gives it back to its host driver.
func (s *Supervisor) DetachHostDev(ctx context.Context, name, which string) error {
	return s.hotplug().DetachHostDev(ctx, name, which)
}

// hotplug is the hot-plug engine on this supervisor's VMs.
func (s *Supervisor) hotplug() *hotplug.Engine { return hotplug.New(s.env) }
