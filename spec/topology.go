package spec

import "fmt"

// Topology is how the guest sees its vCPUs: sockets of dies of cores of
// threads. Their product is max_cpus (every vCPU slot, plugged at boot or
// later); vCPU hotplug fills the slots in socket, core, thread order.
// Unset, the guest sees one socket of max_cpus single-thread cores, as
// before the table existed.
type Topology struct {
	Sockets int `toml:"sockets"` // default: max_cpus / (dies × cores × threads)
	Dies    int `toml:"dies"`    // per socket; default 1
	Cores   int `toml:"cores"`   // per die; default 1
	Threads int `toml:"threads"` // per core; default 1
}

// Set reports whether the file gives a topology.
func (t Topology) Set() bool { return t != Topology{} }

func (vm *VM) applyTopologyDefaults() {
	t := &vm.Topology
	if !t.Set() {
		return
	}
	for _, p := range []*int{&t.Dies, &t.Cores, &t.Threads} {
		if *p == 0 {
			*p = 1
		}
	}
	if per := t.Dies * t.Cores * t.Threads; t.Sockets == 0 && per > 0 && vm.MaxCPUs%per == 0 {
		t.Sockets = vm.MaxCPUs / per
	}
}

func (f *File) validateTopology() error {
	t := f.VM.Topology
	if !t.Set() {
		return nil
	}
	for _, v := range []struct {
		key string
		n   int
	}{{"sockets", t.Sockets}, {"dies", t.Dies}, {"cores", t.Cores}, {"threads", t.Threads}} {
		if v.n < 1 || v.n > 255 {
			if v.key == "sockets" && v.n == 0 {
				return f.Errorf("topology.sockets", "max_cpus %d is not a whole number of sockets of %d dies × %d cores × %d threads",
					f.VM.MaxCPUs, t.Dies, t.Cores, t.Threads)
			}
			return f.Errorf("topology."+v.key, "%d is out of range 1..255", v.n)
		}
	}
	if n := t.Sockets * t.Dies * t.Cores * t.Threads; n != f.VM.MaxCPUs {
		return f.Errorf("topology", "%d sockets × %d dies × %d cores × %d threads = %d vCPU slots, but max_cpus is %d",
			t.Sockets, t.Dies, t.Cores, t.Threads, n, f.VM.MaxCPUs)
	}
	return nil
}

// SMP is the topology as -smp's keys.
func (t Topology) SMP() string {
	return fmt.Sprintf("sockets=%d,dies=%d,cores=%d,threads=%d", t.Sockets, t.Dies, t.Cores, t.Threads)
}
