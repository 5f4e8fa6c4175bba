// Package hotplug plugs devices into a running VM and takes them out again:
// disks, NICs and host PCI devices. Each kind of device is one small
// interface (Device: its intent, its host steps with their undo, its QMP
// parts, how the VM's record holds it, how QEMU shows it, its removal), and
// there is one attach, one detach and one recovery for all of them, run as
// operations of the kernel (internal/lifecycle/operation) under the kinds' journal
// names ("disk-attach", "nic-detach", "hostdev-attach", ...).
//
// The attach: under the VM's lock, the kind checks the device against the
// VM and the host, touching nothing; then a free root port, and as one
// journaled operation the device's host steps (what boot does for it:
// storage.Prepare, the confinement's grants, a tap, a vfio binding), its
// parts over QMP (rendered by qemuargs as at boot, added by
// internal/lifecycle/qdev) and last its record, each step undone if a later one
// fails. The detach asks the guest to release the device, removes its
// parts, takes its host side back, then drops it from the record. A
// command killed in either is settled by the next command on the VM from
// what QEMU really has: a device that reached the guest is adopted, one
// that did not is removed with everything its attach made; a detach the
// guest went along with is finished.
//
// Where a plugged device is recorded is this package's too (record.go). It
// does not own the VM's lifecycle, its QMP session, its confinement or
// its host concerns: it calls down to them in internal/machine's Env.
package hotplug
