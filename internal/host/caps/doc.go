// Package hostcaps finds out what this host's QEMU and KVM can really run,
// in the spirit of libvirt's QEMU capabilities cache: rather than guess from
// /proc/cpuinfo, it asks the QEMU binary (query-version, query-machines,
// query-cpu-definitions, query-qmp-schema) and starts it under KVM with -S
// for each CPU mode vmsup offers, to see which start and which need feature
// masks (an AMD host with PVM KVM aborts on "-cpu host" until
// arch-capabilities is masked). It also gathers the other host facts vmsup
// decides from: vhost-net, vhost-vsock, userfaultfd, io_uring, AppArmor, the
// Open vSwitch datapath, hugepages, IOMMU groups and helper binaries, each
// with the reason when it is missing.
//
// A probe costs a few QEMU starts (well under a second); its result is
// cached as JSON and reused until the QEMU binary (path, size, mtime), the
// kernel release or the state of /dev/kvm change.
//
// It decides nothing about a particular VM: the supervisor asks Caps for the
// accelerator and CPU model to use (Caps.Accel, Caps.CPU), and qemuargs stays
// pure.
package caps
