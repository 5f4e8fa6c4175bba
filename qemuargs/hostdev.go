package qemuargs

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// HostDevDeviceID is the qdev id of the host device's vfio-pci device.
func HostDevDeviceID(name string) string { return "hostdev-" + name }

// HostDevDevice returns h's vfio-pci device on bus (a root port id on q35,
// "pci.0" on pc; Build also sets Addr on pc): the same value for -device
// at boot and for QMP device_add. It only renders: the host side (vfio-pci
// bound, the group's nodes open to QEMU) is the caller's. Errors are
// *Error with Object naming the device.
func HostDevDevice(h spec.HostDev, bus string) (Device, error) {
	fail := func(field, format string, args ...any) (Device, error) {
		e := errorf(field, format, args...)
		e.Object = fmt.Sprintf("hostdev %q", h.Name)
		return Device{}, e
	}
	if err := spec.ValidName(h.Name); err != nil {
		return fail("name", "%v", err)
	}
	addr, err := spec.ParsePCIAddress(h.Address)
	if err != nil {
		return fail("address", "%v", err)
	}
	if addr != h.Address {
		// The spec's own form: what sysfs, the records and QEMU all use.
		return fail("address", "%q is not in its full form %q (spec.Load writes that)", h.Address, addr)
	}
	d := Device{Driver: "vfio-pci", ID: HostDevDeviceID(h.Name), Bus: bus, Host: addr}
	if h.ROMBar != nil {
		on := 0
		if *h.ROMBar {
			on = 1
		}
		d.ROMBar = &on
	}
	return d, nil
}

// hostDevParts renders each host device at its place in the layout.
func hostDevParts(vm *spec.VM, l pciLayout) ([]renderer, error) {
	var parts []renderer
	for i, h := range vm.HostDevs {
		dev, err := HostDevDevice(h, l.hostdevs[i].bus)
		if err != nil {
			return nil, inField(err, fmt.Sprintf("hostdev[%d]", i))
		}
		dev.Addr = l.hostdevs[i].addr
		parts = append(parts, dev)
	}
	return parts, nil
}
