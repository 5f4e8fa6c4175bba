package qemuargs

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// renderer is one part of the command line that renders itself as argv words.
type renderer interface {
	Args() ([]string, error)
}

// flags are options without values, passed as they are.
type flags []string

func (f flags) Args() ([]string, error) { return f, nil }

// guestName is -name: the VM name (shown in QEMU's messages and as the
// process' guest name) and per-vCPU thread names.
type guestName struct{ Name string }

func (n guestName) Args() ([]string, error) {
	v, err := escapeValue(n.Name)
	if err != nil {
		return nil, fmt.Errorf("name: %w", err)
	}
	return []string{"-name", "guest=" + v + ",debug-threads=on"}, nil
}

// machine is -machine with the UEFI flash nodes when there are any.
type machine struct {
	Type             string // "q35", "pc", or a versioned type of either
	PFlash0, PFlash1 string // node names; empty without UEFI
	// MemoryBackend is the id of the -m memory's backend object; empty:
	// QEMU's own anonymous RAM.
	MemoryBackend string
	// Confidential is the id of the confidential-guest-support object
	// (sev-guest); empty: none.
	Confidential string
	// SMM gives the guest System Management Mode and makes the UEFI
	// variable store's flash writable only from it: Secure Boot's
	// firmware keeps its keys there, out of the OS's reach.
	SMM bool
	// AuxRAMShare puts the machine's RAM that no backend object holds
	// (firmware, option ROMs, video memory) in shared memory too (QEMU 10;
	// cpr-transfer needs it).
	AuxRAMShare bool
}

func (m machine) Args() ([]string, error) {
	v := m.Type
	for _, kv := range [][2]string{{"pflash0", m.PFlash0}, {"pflash1", m.PFlash1}, {"memory-backend", m.MemoryBackend}, {"confidential-guest-support", m.Confidential}} {
		if kv[1] == "" {
			continue
		}
		e, err := escapeValue(kv[1])
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", kv[0], err)
		}
		v += "," + kv[0] + "=" + e
	}
	if m.AuxRAMShare {
		v += ",aux-ram-share=on"
	}
	if m.SMM {
		return []string{"-machine", v + ",smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on"}, nil
	}
	return []string{"-machine", v}, nil
}

// accel is -accel kvm|tcg. TCG runs with split-wx=on: its translation
// buffer is mapped twice, writable and executable, never both at once, so
// QEMU has no W+X memory and its unit can set MemoryDenyWriteExecute=.
// The buffer is bounded (tb-size, MiB): QEMU 7.2's default is 1 GiB of
// shared memory, charged to the unit, and a guest that runs much code (or
// reboots a few times) grew past the unit's MemoryMax (guest memory + 256M
// overhead) and was OOM-killed (seen in TestFaultsHotplug).
//
// Hotplug (max_cpus > cpus) runs TCG single-threaded: multi-threaded TCG
// gives each vCPU thread its own region of the buffer, handed out in turn
// until a flush (tcg/region.c); a vCPU hot-plugged when the running ones
// have taken them all hits g_assert in tcg_region_initial_alloc__locked
// and QEMU aborts (seen 1 in 3 on a Debian guest). No tb-size avoids it:
// the regions are at most 8 per max vCPU whatever the size. With
// thread=single all vCPUs share one thread and its one region, so a new
// vCPU takes none; the cost is that the guest's vCPUs share one host core.
type accel struct {
	Name    spec.Accel
	Hotplug bool // vCPUs can be hot-plugged (max_cpus > cpus)
}

// TCGCodeBufferMiB is TCG's translation buffer (tb-size), within the
// unit's default memory overhead.
const TCGCodeBufferMiB = 128

func (a accel) Args() ([]string, error) {
	if a.Name == spec.AccelTCG {
		v := fmt.Sprintf("tcg,split-wx=on,tb-size=%d", TCGCodeBufferMiB)
		if a.Hotplug {
			v += ",thread=single"
		}
		return []string{"-accel", v}, nil
	}
	return []string{"-accel", string(a.Name)}, nil
}

// cpu is -cpu MODEL[,PROP...][,FEATURE=off...]. The model and features
// were checked to be plain names (a comma would add CPU properties); Props
// are whole properties ("hv-relaxed=on") made here.
type cpu struct {
	Model string
	Props []string
	Off   []string
}

func (c cpu) Args() ([]string, error) {
	v := c.Model
	for _, p := range c.Props {
		v += "," + p
	}
	for _, f := range c.Off {
		v += "," + f + "=off"
	}
	return []string{"-cpu", v}, nil
}

// MemorySlots is the number of DIMM slots a VM with memory hotplug
// (max_memory > memory) gets.
const MemorySlots = 4

// memory is -m: the boot memory and, for memory hotplug, the ceiling and the
// DIMM slots.
type memory struct {
	Size, Max spec.Size
	Slots     int
}

func (m memory) Args() ([]string, error) {
	v := fmt.Sprintf("size=%dM", m.Size.MiB())
	if m.Max > m.Size {
		v += fmt.Sprintf(",slots=%d,maxmem=%dM", m.Slots, m.Max.MiB())
	}
	return []string{"-m", v}, nil
}

// smp is -smp: the boot vCPUs, the hotplug ceiling and the topology.
type smp struct {
	CPUs, Max int
	Topology  spec.Topology
}

func (s smp) Args() ([]string, error) {
	v := fmt.Sprint(s.CPUs)
	if s.Max > s.CPUs || s.Topology.Set() {
		v += fmt.Sprintf(",maxcpus=%d", s.Max)
	}
	if t := s.Topology; t.Set() {
		if t.Sockets*t.Dies*t.Cores*t.Threads != s.Max {
			return nil, errorf("topology", "%s makes %d vCPU slots, not max_cpus %d", t.SMP(), t.Sockets*t.Dies*t.Cores*t.Threads, s.Max)
		}
		v += "," + t.SMP()
	}
	return []string{"-smp", v}, nil
}

// biosFile is -bios FILE (qboot). QEMU takes the argument verbatim.
type biosFile struct{ Path string }

func (b biosFile) Args() ([]string, error) { return []string{"-bios", b.Path}, nil }

// kernelBoot is direct kernel boot. QEMU takes -kernel, -initrd and -append
// arguments verbatim (no key=value parsing), so they are not escaped.
type kernelBoot struct{ Kernel, Initrd, Cmdline string }

func (k kernelBoot) Args() ([]string, error) {
	a := []string{"-kernel", k.Kernel}
	if k.Initrd != "" {
		a = append(a, "-initrd", k.Initrd)
	}
	if k.Cmdline != "" {
		a = append(a, "-append", k.Cmdline)
	}
	return a, nil
}

// numaNode is -numa node: a guest node's vCPU slots and its memory backend.
type numaNode struct {
	ID     int
	CPUs   []int
	Memdev string
}

func (n numaNode) Args() ([]string, error) {
	v := fmt.Sprintf("node,nodeid=%d", n.ID)
	for _, r := range spec.CPURanges(n.CPUs) {
		v += ",cpus=" + r // QEMU takes one cpus= per range
	}
	return []string{"-numa", v + ",memdev=" + n.Memdev}, nil
}

// NUMAMemdevID is the id of node n's RAM backend.
func NUMAMemdevID(n int) string { return fmt.Sprintf("ram-node%d", n) }

// MemoryPlace is where guest memory lives: Hugetlbfs, the VM's directory
// on the hugetlbfs mount of its page size ("" for ordinary pages), and
// Shared, mapped MAP_SHARED so another process can map it too (virtiofsd,
// over vhost-user).
type MemoryPlace struct {
	Hugetlbfs string
	Shared    bool
}

// MemoryBackend is the backend object of size bytes of guest memory: a
// memory-backend-ram; with hugetlbfs a memory-backend-file there; shared
// without hugetlbfs, a memory-backend-memfd. The hugetlbfs file is private
// unless Shared (no other process maps the guest's memory) and not
// preallocated: a private hugetlbfs mapping reserves all its pages when
// QEMU maps it, so a host short of free pages fails the start at once,
// never the guest later (SIGBUS), and prealloc would only add the time to
// touch every page. (libvirt preallocates huge pages; vmsup import names
// that difference.)
func MemoryBackend(id string, size int64, at MemoryPlace) Object {
	share := at.Shared
	switch {
	case at.Hugetlbfs != "":
		return Object{QOMType: "memory-backend-file", ID: id, Size: size, MemPath: at.Hugetlbfs, Share: &share}
	case at.Shared:
		return Object{QOMType: "memory-backend-memfd", ID: id, Size: size, Share: &share}
	}
	return Object{QOMType: "memory-backend-ram", ID: id, Size: size}
}

// numaParts are the nodes' memory backends and -numa options.
func numaParts(vm *spec.VM, o Options) ([]renderer, error) {
	var out []renderer
	var sum spec.Size
	for i, n := range vm.NUMA {
		cpus, err := spec.ParseCPUList(n.CPUs)
		if err != nil {
			return nil, errorf(fmt.Sprintf("numa[%d].cpus", i), "%v", err)
		}
		sum += n.Memory
		out = append(out, MemoryBackend(NUMAMemdevID(i), int64(n.Memory), memoryPlace(vm, o)),
			numaNode{ID: i, CPUs: cpus, Memdev: NUMAMemdevID(i)})
	}
	if len(vm.NUMA) > 0 && sum != vm.Memory {
		return nil, errorf("numa", "the nodes' memory adds up to %s, not memory %s", sum, vm.Memory)
	}
	return out, nil
}

// memoryPlace is where the VM's memory backends map its memory: shared
// for virtiofsd, or for a new QEMU to take over (sharesRAM).
func memoryPlace(vm *spec.VM, o Options) MemoryPlace {
	at := MemoryPlace{Shared: vm.HasVirtioFS() || sharesRAM(vm, o)}
	if vm.Hugepages != "" {
		at.Hugetlbfs = o.Hugetlbfs
	}
	return at
}
