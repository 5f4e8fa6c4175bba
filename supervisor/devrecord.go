package supervisor

import (
	"slices"

	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
)

// Where a plugged device is recorded: one of the VM's file (plugged by
// apply) in the record's spec, which then says what the running QEMU
// realizes; one attached by hand (vmsup disk/nic attach) in Attached or
// AttachedNICs, outside the file. Unplugging drops it from either.

// recordDisk records a plugged disk.
func recordDisk(app *vmstate.Applied, a AttachedDisk, fromFile bool) error {
	if !fromFile {
		app.Attached = append(app.Attached, a)
		return nil
	}
	vm, err := app.VM()
	if err != nil {
		return err
	}
	vm.Disks = append(vm.Disks, a.Disk)
	app.SetVM(vm)
	app.Replugged = true
	return nil
}

// hasDisk reports whether the record has the disk, either way.
func hasDisk(app *vmstate.Applied, disk string) bool {
	if slices.ContainsFunc(app.Attached, func(a AttachedDisk) bool { return a.Disk.Name == disk }) {
		return true
	}
	vm, err := app.VM()
	return err == nil && slices.ContainsFunc(vm.Disks, func(d spec.Disk) bool { return d.Name == disk })
}

// dropDisk removes the disk from the record, either way.
func dropDisk(app *vmstate.Applied, disk string) error {
	app.Attached = slices.DeleteFunc(app.Attached, func(a AttachedDisk) bool { return a.Disk.Name == disk })
	vm, err := app.VM()
	if err != nil {
		return err
	}
	if i := slices.IndexFunc(vm.Disks, func(d spec.Disk) bool { return d.Name == disk }); i >= 0 {
		vm.Disks = slices.Delete(vm.Disks, i, i+1)
		app.SetVM(vm)
		app.Replugged = true
	}
	return nil
}

// recordNIC records a plugged NIC.
func recordNIC(app *vmstate.Applied, n spec.NIC, fromFile bool) error {
	if !fromFile {
		app.AttachedNICs = append(app.AttachedNICs, n)
		return nil
	}
	vm, err := app.VM()
	if err != nil {
		return err
	}
	vm.NICs = append(vm.NICs, n)
	app.SetVM(vm)
	app.Replugged = true
	return nil
}

// hasNIC reports whether the record has the NIC, either way.
func hasNIC(app *vmstate.Applied, nic string) bool {
	if slices.ContainsFunc(app.AttachedNICs, func(n spec.NIC) bool { return n.Name == nic }) {
		return true
	}
	vm, err := app.VM()
	return err == nil && slices.ContainsFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == nic })
}

// dropNIC removes the NIC from the record, either way.
func dropNIC(app *vmstate.Applied, nic string) error {
	app.AttachedNICs = slices.DeleteFunc(app.AttachedNICs, func(n spec.NIC) bool { return n.Name == nic })
	vm, err := app.VM()
	if err != nil {
		return err
	}
	if i := slices.IndexFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == nic }); i >= 0 {
		vm.NICs = slices.Delete(vm.NICs, i, i+1)
		app.SetVM(vm)
		app.Replugged = true
	}
	return nil
}
