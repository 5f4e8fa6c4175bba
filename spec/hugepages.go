package spec

import "fmt"

// Hugepage sizes the hugepages key takes: x86's two hugetlbfs page sizes.
const (
	Hugepages2M = "2M"
	Hugepages1G = "1G"
)

// HugepageSize is the page size of the VM's memory: 0 for ordinary
// (anonymous) memory, else 2 MiB or 1 GiB.
func (vm *VM) HugepageSize() Size {
	switch vm.Hugepages {
	case Hugepages2M:
		return 2 * MiB
	case Hugepages1G:
		return GiB
	}
	return 0
}

// validateHugepages: every piece of memory QEMU maps on hugetlbfs (the boot
// memory, each NUMA node's, a hot-plugged DIMM) is a whole number of pages.
func (f *File) validateHugepages() error {
	vm := &f.VM
	if vm.Hugepages == "" {
		return nil
	}
	page := vm.HugepageSize()
	if page == 0 {
		return f.Errorf("hugepages", "unknown page size %q (want %q or %q)", vm.Hugepages, Hugepages2M, Hugepages1G)
	}
	if vm.Memory%page != 0 {
		return f.Errorf("memory", "%s is not a whole number of %s hugepages", vm.Memory, vm.Hugepages)
	}
	if vm.MaxMemory%page != 0 {
		return f.Errorf("max_memory", "%s is not a whole number of %s hugepages (hot-plugged memory is on them too)", vm.MaxMemory, vm.Hugepages)
	}
	for i, n := range vm.NUMA {
		if n.Memory%page != 0 {
			return f.Errorf(fmt.Sprintf("numa[%d].memory", i), "%s is not a whole number of %s hugepages", n.Memory, vm.Hugepages)
		}
	}
	return nil
}

// ShareableMemory reports whether the guest's memory may be shared memory
// (shared_memory unset or true, no hugepages, no SEV).
func (vm *VM) ShareableMemory() bool {
	return (vm.SharedMemory == nil || *vm.SharedMemory) && vm.Hugepages == "" && vm.SEV == nil
}

// validateSharedMemory: shared_memory = true asks for what hugepages
// (a private hugetlbfs file) and SEV (encrypted pages) cannot be.
func (f *File) validateSharedMemory() error {
	vm := &f.VM
	if vm.SharedMemory == nil || !*vm.SharedMemory {
		return nil
	}
	switch {
	case vm.Hugepages != "":
		return f.Errorf("shared_memory", "memory on hugepages stays private (its pages are reserved when QEMU maps them): drop one of the two")
	case vm.SEV != nil:
		return f.Errorf("shared_memory", "memory encrypted by SEV stays private: drop one of the two")
	}
	return nil
}
