// Package diskops is vmsup's disk operations on a VM: snapshots (take,
// remove, revert, with memory and RBD disks), backups (points into a backup
// directory and their restore), live disk moves, the NBD export for
// pull-mode backup tools, and clones started from a template's memory
// snapshot. Each runs as an operation of the kernel (internal/lifecycle/operation):
// its kind and step markers are declared beside it, its intent and steps
// journaled, and its recoverer (registered by Service.Register) finishes
// or undoes it from QEMU's and systemd's real state when its command died.
//
// It does not own a VM's lifecycle: it calls down into the environment
// (internal/machine.Env) for the running view, QMP and guest-agent
// sessions, confinement grants, lifecycle events, the storage tools, and
// to stop a VM or start one from a memory state.
package diskops
