package spec

import (
	"fmt"
	"strconv"
	"strings"
)

// NUMANode is one guest NUMA node: the vCPU slots on it and its share of
// the boot memory. Hot-plugged memory (max_memory) goes to node 0.
type NUMANode struct {
	CPUs   string `toml:"cpus"`   // vCPU slot indexes, a list: "0-1" ([topology] decides which socket they are)
	Memory Size   `toml:"memory"` // the nodes' memory adds up to memory
}

// MaxNUMANodes bounds [[numa]] (QEMU takes more; no guest here needs them).
const MaxNUMANodes = 16

// CPURanges renders a list of CPU numbers as "A-B" ranges, in order.
func CPURanges(cpus []int) []string {
	var out []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if i == j {
			out = append(out, strconv.Itoa(cpus[i]))
		} else {
			out = append(out, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return out
}

func (f *File) validateNUMA() error {
	vm := &f.VM
	if len(vm.NUMA) == 0 {
		return nil
	}
	if len(vm.NUMA) > MaxNUMANodes {
		return f.Errorf("numa", "%d nodes, at most %d", len(vm.NUMA), MaxNUMANodes)
	}
	owner := map[int]int{}
	var sum Size
	for i, n := range vm.NUMA {
		field := fmt.Sprintf("numa[%d]", i)
		cpus, err := ParseCPUList(n.CPUs)
		if err != nil {
			return f.Errorf(field+".cpus", "%v", err)
		}
		for _, c := range cpus {
			if c >= vm.MaxCPUs {
				return f.Errorf(field+".cpus", "vCPU %d: the VM has slots 0..%d (max_cpus %d)", c, vm.MaxCPUs-1, vm.MaxCPUs)
			}
			if j, dup := owner[c]; dup {
				return f.Errorf(field+".cpus", "vCPU %d is also on numa[%d]", c, j)
			}
			owner[c] = i
		}
		if n.Memory <= 0 || n.Memory%MiB != 0 {
			return f.Errorf(field+".memory", "%s is not a positive whole number of MiB", n.Memory)
		}
		sum += n.Memory
	}
	if len(owner) != vm.MaxCPUs {
		var missing []int
		for c := 0; c < vm.MaxCPUs; c++ {
			if _, ok := owner[c]; !ok {
				missing = append(missing, c)
			}
		}
		return f.Errorf("numa", "vCPU slots %s are on no node: every slot (max_cpus %d) needs one", strings.Join(CPURanges(missing), ","), vm.MaxCPUs)
	}
	if sum != vm.Memory {
		return f.Errorf("numa", "the nodes' memory adds up to %s, but memory is %s", sum, vm.Memory)
	}
	return nil
}
