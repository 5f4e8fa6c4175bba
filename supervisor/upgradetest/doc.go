// Package upgradetest checks a QEMU upgrade under running guests: guests
// started on the installed QEMU 7.2, with a memory snapshot, a disk
// snapshot and an incremental backup chain, then QEMU 10 (from
// scripts/install-qemu10.sh's prefix) put in place the way a package
// upgrade puts it, bound over 7.2's files in the sandbox's, the running
// units' and the test's own mount namespaces (testenv.PutQEMU10), while
// the running QEMUs keep their mapped 7.2 binary. `vmsup migrate --local`
// moves each guest onto QEMU 10 (its pinned machine type kept, its counter
// uninterrupted), and the snapshots and backups taken on 7.2 still revert
// and restore there. Between two "hosts" (network namespaces, one of them
// on QEMU 10) a VM migrates both ways where QEMU can take it, and is
// refused before anything moves where it cannot.
//
// The test binary runs in mount and network namespaces of its own
// (testenv.InPrivateMountNetns); every test skips, saying why, where QEMU
// 10 is not installed. It is a package of its own so that its guests boot
// beside the other packages' tests.
package upgradetest
