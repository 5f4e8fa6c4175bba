// Package paritytest checks, on a real guest and real storage targets, what
// a VM moved from libvirt keeps: SCSI disks and LUN passthrough, RBD
// snapshots and namespaces, iSCSI initiator ACLs, its SMBIOS identity and
// credentials, and virtio-rng. It is a package of its own so that its guest
// boots beside the supervisor package's tests, not after them.
package paritytest
