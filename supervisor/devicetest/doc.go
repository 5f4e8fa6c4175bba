// Package devicetest checks, on a real guest, the guest devices backed by
// something outside QEMU: a TPM 2.0 (swtpm in a companion unit) whose state
// survives down/up and a local migration, host folders over virtio-9p,
// guest memory on hugepages, and UEFI Secure Boot with enrolled keys. It is
// a package of its own so that its guests boot beside the supervisor
// package's tests, not after them.
package devicetest
