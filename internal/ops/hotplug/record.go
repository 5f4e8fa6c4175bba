package hotplug

import (
	"slices"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Where a plugged device is recorded: one of the VM's file (plugged by
// apply) in the record's spec, which then says what the running QEMU
// realizes; one attached by hand (vmsup disk/nic attach) in Attached or
// AttachedNICs, outside the file. Unplugging drops it from either. Host
// devices are live only (AttachedHostDevs).

// editSpec changes the record's spec by a device plugged or unplugged
// (which Replugged notes: the layout is no longer the spec's boot layout).
func editSpec(app *vmstore.Applied, edit func(vm *spec.VM)) error {
	vm, err := app.VM()
	if err != nil {
		return err
	}
	edit(vm)
	app.SetVM(vm)
	app.Replugged = true
	return nil
}

// recordDisk records a plugged disk.
func recordDisk(app *vmstore.Applied, a vmstore.AttachedDisk, fromFile bool) error {
	if !fromFile {
		app.Attached = append(app.Attached, a)
		return nil
	}
	return editSpec(app, func(vm *spec.VM) { vm.Disks = append(vm.Disks, a.Disk) })
}

// hasDisk reports whether the record has the disk, either way.
func hasDisk(app *vmstore.Applied, disk string) bool {
	if slices.ContainsFunc(app.Attached, func(a vmstore.AttachedDisk) bool { return a.Disk.Name == disk }) {
		return true
	}
	vm, err := app.VM()
	return err == nil && findDisk(vm, disk) != nil
}

// dropDisk removes the disk from the record, either way.
func dropDisk(app *vmstore.Applied, disk string) error {
	app.Attached = slices.DeleteFunc(app.Attached, func(a vmstore.AttachedDisk) bool { return a.Disk.Name == disk })
	delete(app.Moved, disk) // a disk of the file, moved: gone with it
	if vm, err := app.VM(); err != nil || findDisk(vm, disk) == nil {
		return err
	}
	return editSpec(app, func(vm *spec.VM) {
		vm.Disks = slices.DeleteFunc(vm.Disks, func(d spec.Disk) bool { return d.Name == disk })
	})
}

// recordNIC records a plugged NIC.
func recordNIC(app *vmstore.Applied, n spec.NIC, fromFile bool) error {
	if !fromFile {
		app.AttachedNICs = append(app.AttachedNICs, n)
		return nil
	}
	return editSpec(app, func(vm *spec.VM) { vm.NICs = append(vm.NICs, n) })
}

// hasNIC reports whether the record has the NIC, either way.
func hasNIC(app *vmstore.Applied, nic string) bool {
	if slices.ContainsFunc(app.AttachedNICs, func(n spec.NIC) bool { return n.Name == nic }) {
		return true
	}
	vm, err := app.VM()
	return err == nil && findNIC(vm, nic) != nil
}

// dropNIC removes the NIC from the record, either way.
func dropNIC(app *vmstore.Applied, nic string) error {
	app.AttachedNICs = slices.DeleteFunc(app.AttachedNICs, func(n spec.NIC) bool { return n.Name == nic })
	if vm, err := app.VM(); err != nil || findNIC(vm, nic) == nil {
		return err
	}
	return editSpec(app, func(vm *spec.VM) {
		vm.NICs = slices.DeleteFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == nic })
	})
}

// hasHostDev reports whether the record has the host device at addr.
func hasHostDev(app *vmstore.Applied, addr string) bool {
	return slices.ContainsFunc(app.AttachedHostDevs, func(a vmstore.AttachedHostDev) bool { return a.Dev.Address == addr })
}

// dropHostDev removes the host device at addr from the record.
func dropHostDev(app *vmstore.Applied, addr string) {
	app.AttachedHostDevs = slices.DeleteFunc(app.AttachedHostDevs, func(a vmstore.AttachedHostDev) bool {
		return a.Dev.Address == addr
	})
}

func findNIC(vm *spec.VM, name string) *spec.NIC {
	if i := slices.IndexFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == name }); i >= 0 {
		return &vm.NICs[i]
	}
	return nil
}

func findDisk(vm *spec.VM, name string) *spec.Disk {
	if i := slices.IndexFunc(vm.Disks, func(d spec.Disk) bool { return d.Name == name }); i >= 0 {
		return &vm.Disks[i]
	}
	return nil
}
