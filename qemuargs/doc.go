// Package qemuargs renders a typed VM description (spec.VM) into the argv of
// qemu-system-x86_64. Build is a pure function: no I/O, no clock, no
// environment; the same VM and Options always give the same argv, which the
// golden files under testdata/qemuargs pin down.
//
// qemuargs owns the rendering: which options QEMU gets, in which syntax, the
// PCI(e) layout (one pcie-root-port per boot-time disk and NIC plus
// vm.Slots() empty ports for hotplug on q35; explicit slots on pci.0 for the
// pc machine), and the ids and node names of everything it creates (see
// DiskNodeName, DiskDeviceID, NICDeviceID, NetdevID, RootPortID).
//
// It does not own host facts: the caller resolves the accelerator (probing
// KVM), the socket paths, the firmware files and the VM's copy of the UEFI
// variable store, and passes them in Options. Whether files exist is not
// checked here.
//
// # One value for boot and hotplug
//
// Disks, NICs and devices are typed values (Object, Blockdev, Netdev,
// Device) whose JSON encoding is exactly the object QEMU takes both on the
// command line (-object/-blockdev/-netdev/-device in JSON syntax) and as the
// arguments of the QMP commands object-add, blockdev-add, netdev_add and
// device_add. Disk (every disk type: file, host_device, CD-ROM on its own
// virtio-scsi controller, iSCSI, RBD, with their secret and iothread
// objects), NICNetdev and NICDevice build them from spec values, so a disk
// hot-plugged later is described by the very code that described it at
// boot. Secrets appear only as the path of a file (DiskHost.SecretFile).
//
// # Confinement
//
// With vm.Security.HasSeccomp() (the default) the argv carries QEMU's own
// seccomp filter, -sandbox SeccompSandbox. TCG always runs with
// split-wx=on, so QEMU never maps memory writable and executable at once and
// its systemd unit can set MemoryDenyWriteExecute=.
//
// # Escaping
//
// Options that QEMU parses as key=value lists (-chardev, -name, -machine)
// get user strings through escapeValue, which doubles commas. JSON options
// need no escaping beyond JSON's own. -kernel, -initrd, -append and -bios
// take their argument verbatim (QEMU does not split them at commas), so they
// are passed as is. Strings QEMU cannot take (newline, NUL, invalid UTF-8)
// are errors.
package qemuargs
