package identity

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// A VM's machine type is part of what its guest sees (chipset, firmware
// tables, device defaults), and an alias (q35, pc) means the newest type of
// the QEMU at hand: after a QEMU upgrade every VM would boot on other
// virtual hardware, and a migration between the two QEMUs fails ("Machine
// type received is 'pc-q35-7.2' and local is 'pc-q35-10.0'"). So the
// versioned type resolved at a VM's first start is recorded and kept; a
// file naming another versioned type moves the VM to it (a restart-class
// change plan shows).

// PinMachine returns the machine type a start runs: the file's own when it
// names a versioned type; else the recorded one (pinned at the VM's first
// start) while it is of the family the file names; else the file's alias
// resolved by this QEMU. resolve checks that QEMU offers a type and
// resolves an alias.
func PinMachine(want, recorded string, resolve func(string) (string, error)) (string, error) {
	if spec.MachineVersioned(want) || !spec.MachineVersioned(recorded) || spec.MachineFamily(recorded) != spec.MachineFamily(want) {
		return resolve(want)
	}
	if _, err := resolve(recorded); err != nil {
		return "", fmt.Errorf("its machine type %s, kept since its first start, is not offered here: %w; "+
			"name one this QEMU offers in machine to move the VM to it", recorded, err)
	}
	return recorded, nil
}

// KeepMachine: a file (want) naming the family of the machine type the VM
// runs (recorded), or that type itself, asks for no change of it. running,
// the spec the VM runs, shows the recorded type otherwise, so that a diff
// says which type it moves from.
func KeepMachine(running, want *spec.VM, recorded string) {
	switch {
	case !spec.MachineVersioned(recorded):
	case want.Machine == recorded || !spec.MachineVersioned(want.Machine) && spec.MachineFamily(want.Machine) == spec.MachineFamily(recorded):
		running.Machine = want.Machine
	default:
		running.Machine = recorded
	}
}
