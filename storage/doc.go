// Package storage owns what vmsup does with disks on the host before and
// around QEMU: it inspects and creates images (qcow2 on demand, overlays on a
// shared base), resolves backing chains, builds cloud-init NoCloud seed
// ISOs, keeps disk secrets (CHAP passwords, cephx keys) in 0600 files, and
// checks every disk so that a bad one fails with one clear line naming it
// before QEMU starts.
//
// Images are created and inspected with qemu-img (--output=json): it is the
// same block layer QEMU uses, so formats, backing-file rules, image locks
// and the iSCSI and RBD drivers behave exactly as they will in the VM, and
// vmsup does not carry a second qcow2 implementation. iSCSI and RBD disks
// are probed with `qemu-img info --image-opts` through the very drivers and
// options QEMU will use (login, CHAP, LUN, pool, image), under a timeout.
//
// storage does not render QEMU arguments (package qemuargs does) and knows
// nothing of a VM's lifecycle (package supervisor calls Check, Prepare and
// Teardown at the right moments).
package storage
