package spec

import "regexp"

// Machine families vmsup lays out. A VM's machine is one of these aliases,
// which QEMU resolves to its newest versioned type, or a versioned type of
// one of them (pc-q35-X.Y, pc-i440fx-X.Y): the guest's virtual hardware,
// which vmsup pins at the VM's first start (internal/lifecycle/identity).
const (
	MachineQ35 = "q35"
	MachinePC  = "pc"
)

var versionedMachine = regexp.MustCompile(`^pc-(q35|i440fx)-[0-9]+\.[0-9]+$`)

// MachineFamily is the family of a machine type ("q35" or "pc"), or "" for
// a type vmsup does not lay out.
func MachineFamily(name string) string {
	switch name {
	case MachineQ35, MachinePC:
		return name
	}
	m := versionedMachine.FindStringSubmatch(name)
	switch {
	case m == nil:
		return ""
	case m[1] == "q35":
		return MachineQ35
	default:
		return MachinePC
	}
}

// MachineVersioned reports whether name is a versioned machine type (not
// an alias whose meaning changes with QEMU).
func MachineVersioned(name string) bool { return versionedMachine.MatchString(name) }

// Q35 reports whether the VM's machine is of the q35 family (PCIe root
// ports, AHCI, SMM); else it is pc (i440fx, a flat pci.0).
func (vm *VM) Q35() bool { return MachineFamily(vm.Machine) == MachineQ35 }
