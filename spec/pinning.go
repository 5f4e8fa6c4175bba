package spec

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Pinning places the VM's threads on host CPUs: each vCPU on one CPU of
// its own choosing (not a group all vCPUs float over), and QEMU's other
// threads (main loop, I/O) on a set.
type Pinning struct {
	// VCPUs is the host CPU of vCPU 0, 1, ...: one per vCPU slot
	// (max_cpus), so a vCPU hot-plugged later is pinned too.
	VCPUs []int `toml:"vcpus"`
	// Emulator is the host CPUs of QEMU's other threads, as a list
	// ("0-3,6"): the unit's CPUAffinity=.
	Emulator string `toml:"emulator"`
}

// EmulatorCPUs are the host CPUs Emulator lists (nil when it lists none):
// the unit's affinity, which QEMU's threads inherit until vmsup pins each
// vCPU's.
func (p Pinning) EmulatorCPUs() []int {
	if p.Emulator == "" {
		return nil
	}
	cpus, _ := ParseCPUList(p.Emulator) // checked when the file was read
	return cpus
}

// MaxHostCPU bounds a host CPU number (systemd's CPUAffinity= takes up to
// 8192; no host here comes close).
const MaxHostCPU = 4095

// ParseCPUList parses a CPU list ("0-3,6") into sorted CPU numbers.
func ParseCPUList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b > MaxHostCPU {
			return nil, fmt.Errorf("%q is not a CPU list (e.g. \"0-3,6\", CPUs 0..%d)", s, MaxHostCPU)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (f *File) validatePinning() error {
	p := f.VM.Pinning
	if len(p.VCPUs) > 0 && len(p.VCPUs) != f.VM.MaxCPUs {
		return f.Errorf("pinning.vcpus", "%d host CPUs for %d vCPU slots (max_cpus): give one per vCPU", len(p.VCPUs), f.VM.MaxCPUs)
	}
	for i, c := range p.VCPUs {
		if c < 0 || c > MaxHostCPU {
			return f.Errorf(fmt.Sprintf("pinning.vcpus[%d]", i), "%d is not a host CPU number (0..%d)", c, MaxHostCPU)
		}
	}
	if p.Emulator != "" {
		if _, err := ParseCPUList(p.Emulator); err != nil {
			return f.Errorf("pinning.emulator", "%v", err)
		}
	}
	return nil
}
