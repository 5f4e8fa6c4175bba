package qemuargs

import (
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestRAMOf: the RAM block's name follows the spec (QEMU's pc.ram, or
// ram-main for hugepages and virtiofs, none with NUMA nodes) unless a
// source's is given; sharing never reaches a hugetlbfs file.
func TestRAMOf(t *testing.T) {
	plain, huge, fs := &spec.VM{}, &spec.VM{Hugepages: spec.Hugepages2M}, &spec.VM{Shares: []spec.Share{{Driver: spec.ShareVirtioFS}}}
	numa := &spec.VM{NUMA: []spec.NUMANode{{CPUs: "0"}}}
	for _, c := range []struct {
		name string
		vm   *spec.VM
		o    Options
		want RAM
	}{
		{"plain", plain, Options{}, RAM{ID: DefaultRAMID}},
		{"plain shared", plain, Options{ShareRAM: true}, RAM{ID: DefaultRAMID, Shared: true}},
		{"hugepages", huge, Options{ShareRAM: true}, RAM{ID: MainMemdevID}},
		{"virtiofs", fs, Options{}, RAM{ID: MainMemdevID}},
		{"virtiofs shared", fs, Options{ShareRAM: true}, RAM{ID: MainMemdevID, Shared: true}},
		{"numa", numa, Options{ShareRAM: true}, RAM{Shared: true}},
		{"sev", &spec.VM{SEV: &spec.SEV{}}, Options{ShareRAM: true}, RAM{ID: DefaultRAMID}},
		{"shared_memory = false", &spec.VM{SharedMemory: new(bool)}, Options{ShareRAM: true}, RAM{ID: DefaultRAMID}},
		{"a source's name", plain, Options{RAMID: MainMemdevID}, RAM{ID: MainMemdevID}},
	} {
		if got := RAMOf(c.vm, c.o); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
