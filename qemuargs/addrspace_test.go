package qemuargs

import (
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestPhysBits: the top of the guest's address space as QEMU 7.2 lays it
// out, against the vCPU's phys-bits. 1 TiB of max_memory (issue 51's
// reading of libvirt's memory-hotplug-dimm) QEMU refuses under phys-bits 40
// ("phys-bits too low (40)"); the largest max_memory that fits passes.
func TestPhysBits(t *testing.T) {
	vm := &spec.VM{Machine: "q35", Memory: 214 * spec.MiB, MaxMemory: spec.Size(1) << 40}
	// 4 GiB, the 1 TiB hotplug region less the boot memory, 4 slots of
	// 1 GiB alignment (rounded up to 1 GiB), the 32 GiB PCI window.
	if got, want := HighestGuestAddress(vm, false), uint64(1<<40+8<<30+32<<30-1); got != want {
		t.Errorf("top %#x, want %#x", got, want)
	}
	// qemu64 is AMD's: QEMU moves the RAM above 4 GiB to 1 TiB (its
	// message: "0xffffffffff < 0x208ffffffff phys-bits too low (40)").
	amd := AMDModel(spec.AccelTCG, "qemu64", false)
	why := PhysBitsError(vm, GuestPhysBits(spec.AccelTCG, "qemu64", 48), amd, "-cpu qemu64 under tcg")
	for _, want := range []string{"1T puts", "0x208ffffffff", "40 physical address bits", "-cpu qemu64 under tcg", "at most"} {
		if !strings.Contains(why, want) {
			t.Errorf("error %q lacks %q", why, want)
		}
	}
	// The largest that fits passes, 1 GiB more does not (QEMU 7.2 starts
	// Skylake-Client with 1007830M, not qemu64; qemu64 with 995542M, measured).
	for _, c := range []struct {
		amd  bool
		want uint64
	}{{false, 1007830}, {true, 995542}} {
		fit := MaxMemoryFor(vm, 40, c.amd)
		vm.MaxMemory = spec.Size(fit)
		if why := PhysBitsError(vm, 40, c.amd, "x"); why != "" || fit != c.want<<20 {
			t.Errorf("amd %v: max_memory %s (MaxMemoryFor, want %dM) refused: %s", c.amd, vm.MaxMemory, c.want, why)
		}
		vm.MaxMemory += spec.GiB
		if PhysBitsError(vm, 40, c.amd, "x") == "" {
			t.Errorf("amd %v: max_memory %s passes phys-bits 40", c.amd, vm.MaxMemory)
		}
	}
	// Without hotplug: RAM and the PCI window only; pc's window is 2 GiB.
	small := &spec.VM{Machine: "pc", Memory: 4 * spec.GiB, MaxMemory: 4 * spec.GiB}
	if got, want := HighestGuestAddress(small, false), uint64(4<<30+1<<30+2<<30-1); got != want {
		t.Errorf("pc 4G: top %#x, want %#x", got, want)
	}
	if b := GuestPhysBits(spec.AccelKVM, "host", 46); b != 46 {
		t.Errorf("KVM host: %d bits, want the host's 46", b)
	}
	if b := GuestPhysBits(spec.AccelKVM, "qemu64", 46); b != DefaultPhysBits {
		t.Errorf("KVM qemu64: %d bits, want %d", b, DefaultPhysBits)
	}
}
