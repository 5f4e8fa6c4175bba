package qemuargs

import (
	"fmt"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// The guest's physical address space as QEMU 7.2's pc and q35 machines
// lay it out (hw/i386/pc.c pc_memory_init): RAM below 4 GiB, the rest
// above it, the hotplug region for max_memory, then the 64-bit PCI
// window. QEMU refuses to start when the top is past what the vCPU's
// phys-bits address ("phys-bits too low").

// DefaultPhysBits is QEMU's phys-bits for a named CPU model, and for any
// under TCG (TCG_PHYS_ADDR_BITS); under KVM host and max take the host's.
const DefaultPhysBits = 40

// GuestPhysBits is the physical address width the guest's vCPU gets:
// the host's (hostBits, 0: unknown) for host and max under KVM
// (host-phys-bits), else DefaultPhysBits.
func GuestPhysBits(accel spec.Accel, model string, hostBits int) int {
	if accel == spec.AccelKVM && (model == "host" || model == "max") && hostBits > 0 {
		return hostBits
	}
	return DefaultPhysBits
}

const (
	gib = uint64(1) << 30
	// pciHole64 is the 64-bit PCI window's default size: q35's
	// Q35_PCI_HOST_HOLE64_SIZE_DEFAULT, i440fx's I440FX_..._DEFAULT.
	pciHole64Q35 = 32 * gib
	pciHole64PC  = 2 * gib
)

// AMD's HyperTransport hole below 1 TiB: QEMU moves an AMD vCPU's RAM
// above 4 GiB (and all after it) to 1 TiB when the top would cross it.
const (
	amdHTStart    = 0xfd00000000
	amdAbove1TiB  = uint64(1) << 40
	above4GiBBase = 4 * gib
)

// HighestGuestAddress is the top of vm's guest physical address space
// (QEMU's pc_max_used_gpa): the end of the 64-bit PCI window above RAM
// and the hotplug region (each DIMM slot aligned to 1 GiB); amd: the
// vCPU is AMD's (qemu64, EPYC, max under TCG), whose layout may move.
func HighestGuestAddress(vm *spec.VM, amd bool) uint64 {
	top := topAt(vm, above4GiBBase)
	if amd && top >= amdHTStart {
		top = topAt(vm, amdAbove1TiB)
	}
	return top
}

// topAt is the top with RAM above 4 GiB starting at base.
func topAt(vm *spec.VM, base uint64) uint64 {
	ram, maxMem := uint64(vm.Memory), uint64(vm.MaxMemory)
	below, hole := min(ram, 0xb0000000), pciHole64Q35
	if ram >= 0xb0000000 {
		below = 0x80000000 // q35's gigabyte-aligned low RAM
	}
	if vm.Machine == "pc" {
		below, hole = min(ram, 0xe0000000), pciHole64PC
		if ram >= 0xe0000000 {
			below = 0xc0000000
		}
	}
	top := base + ram - below
	if maxMem > ram {
		top = roundUp(top, gib) + maxMem - ram + gib*MemorySlots
	}
	return roundUp(top, gib) + hole - 1
}

// MaxMemoryFor is the largest max_memory whose top fits in bits, for
// vm's boot memory and machine (0: none does).
func MaxMemoryFor(vm *spec.VM, bits int, amd bool) uint64 {
	limit := uint64(1) << bits
	fit := maxMemoryBelow(vm, above4GiBBase, limit)
	if amd {
		// Below the hole at 4 GiB, or moved to 1 TiB when that fits more.
		fit = max(maxMemoryBelow(vm, above4GiBBase, min(limit, amdHTStart)), maxMemoryBelow(vm, amdAbove1TiB, limit))
	}
	return fit
}

// maxMemoryBelow is the largest max_memory whose top, RAM above 4 GiB
// at base, is below limit.
func maxMemoryBelow(vm *spec.VM, base, limit uint64) uint64 {
	v := *vm
	v.MaxMemory = v.Memory
	end := topAt(&v, base) + 1 // the window's end without a hotplug region
	if end > limit || limit-end < gib*MemorySlots {
		return 0
	}
	return (uint64(vm.Memory) + limit - end - gib*MemorySlots) &^ (uint64(spec.MiB) - 1)
}

// AMDModel reports whether QEMU's CPU model is AMD's: for host (and max
// under KVM) the host's vendor decides (hostAMD).
func AMDModel(accel spec.Accel, model string, hostAMD bool) bool {
	if model == "host" || model == "max" && accel == spec.AccelKVM {
		return hostAMD
	}
	m := strings.ToLower(model)
	for _, p := range []string{"qemu64", "max", "epyc", "opteron", "phenom", "athlon"} {
		if strings.HasPrefix(m, p) {
			return true
		}
	}
	return false
}

// PhysBitsError is why QEMU would refuse vm on a vCPU (cpu, as "-cpu
// qemu64 under tcg") of bits physical address bits ("" when it would not).
func PhysBitsError(vm *spec.VM, bits int, amd bool, cpu string) string {
	top := HighestGuestAddress(vm, amd)
	if bits >= 64 || top < uint64(1)<<bits {
		return ""
	}
	return fmt.Sprintf("%s puts the guest's highest address at %#x, past the %d physical address bits (phys-bits) of %s: QEMU would refuse it (at most %s here)",
		vm.MaxMemory, top, bits, cpu, spec.Size(MaxMemoryFor(vm, bits, amd)))
}

func roundUp(v, to uint64) uint64 { return (v + to - 1) / to * to }
