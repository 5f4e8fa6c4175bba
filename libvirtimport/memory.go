package libvirtimport

import (
	"errors"
	"fmt"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// The guest's memory: its size at boot (with the DIMMs libvirt plugs at
// start), the hotplug ceiling, NUMA nodes and what backs them.

// memory maps <memory>, <maxMemory>, <currentMemory>, the NUMA cells and
// the DIMMs. libvirt's <memory> is all the guest has at boot, DIMMs
// included; with NUMA cells libvirt boots with their sum plus the DIMMs,
// whatever <memory> says. vmsup boots with the same total: a DIMM's
// memory joins its node's (vmsup plugs DIMMs later, by vmsup apply).
func (c *converter) memory() error {
	d := c.dom
	if d.Memory == nil || d.Memory.Value == 0 {
		return errors.New("no <memory>: vmsup needs the guest's memory size")
	}
	b, err := bytesOf(d.Memory.Value, d.Memory.Unit)
	if err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	perNode := c.dimms()
	if d.CPU != nil && d.CPU.Numa != nil && len(d.CPU.Numa.Cell) > 0 {
		if sum, ok := c.numa(d.CPU.Numa, perNode); ok && sum != b {
			c.note("memory", "%d MiB: libvirt boots with the NUMA cells' memory (and any DIMMs), %d MiB, and so does vmsup", b>>20, sum>>20)
			b = sum
		}
	}
	var exact bool
	if c.out.Memory, exact = mib(b); !exact {
		c.note("memory", "%d bytes is not a whole number of MiB: rounded up to %s", b, c.out.Memory)
	}
	if m := d.MaximumMemory; m != nil && m.Value > 0 {
		if mb, err := bytesOf(m.Value, m.Unit); err == nil && mb > b {
			c.out.MaxMemory, _ = mib(mb)
		}
		if m.Slots != 0 && m.Slots != 4 {
			c.note("maxMemory/@slots", "%d: vmsup gives a VM 4 DIMM slots", m.Slots)
		}
	}
	if cm := d.CurrentMemory; cm != nil && cm.Value > 0 {
		if cb, err := bytesOf(cm.Value, cm.Unit); err == nil && cb < b {
			c.out.BalloonTarget, _ = mib(cb) // kept only if there is a balloon (devices)
		}
	}
	return nil
}

// dimms returns the memory of the DIMMs plugged at start, by NUMA node,
// with a line each; other memory devices are not carried over.
func (c *converter) dimms() map[int]uint64 {
	out := map[int]uint64{}
	if c.dom.Devices == nil {
		return out
	}
	for i, m := range c.dom.Devices.Memorydevs {
		el := fmt.Sprintf("devices/memory[%d]", i)
		t := m.Target
		if m.Model != "dimm" || t == nil || t.Size == nil || m.Source != nil || m.Access != "" || m.Discard != "" {
			c.drop(el, "model %q: vmsup's memory devices are plain DIMMs it plugs itself (max_memory)", m.Model)
			continue
		}
		b, err := bytesOf(t.Size.Value, t.Size.Unit)
		if err != nil {
			c.drop(el, "%v", err)
			continue
		}
		node := 0
		if t.Node != nil {
			node = int(t.Node.Value)
		}
		out[node] += b
		c.note(el, "a %d MiB DIMM plugged at start: vmsup boots with it as part of memory (node %d), where it cannot be unplugged; vmsup apply plugs DIMMs", b>>20, node)
	}
	return out
}

// numa maps the cells, in order (vmsup's node ids are their places),
// each with the DIMMs on it; it returns their sum, false when they are
// not carried over.
func (c *converter) numa(n *libvirtxml.DomainNuma, dimms map[int]uint64) (uint64, bool) {
	var out []fileNUMA
	var sum uint64
	slots := uint(0)
	if c.dom.VCPU != nil {
		slots = c.dom.VCPU.Value
	}
	owned := map[int]bool{}
	for i, cell := range n.Cell {
		b, err := bytesOf(cell.Memory, cell.Unit)
		b += dimms[i]
		m, exact := mib(b)
		cpus, cerr := spec.ParseCPUList(cell.CPUs)
		if err != nil || !exact || cerr != nil || (cell.ID != nil && int(*cell.ID) != i) {
			c.drop("cpu/numa", "cell %d: vmsup's nodes are numbered in order with whole MiB of memory and a CPU list", i)
			return 0, false
		}
		for _, v := range cpus {
			owned[v] = true
		}
		sum += b
		out = append(out, fileNUMA{CPUs: cell.CPUs, Memory: m, el: fmt.Sprintf("cpu/numa/cell[%d]", i)})
		if cell.Distances != nil || len(cell.Caches) > 0 || cell.MemAccess != "" {
			c.drop(fmt.Sprintf("cpu/numa/cell[%d]/distances", i), "distances, caches and memAccess: QEMU's defaults apply")
		}
	}
	if uint(len(owned)) != slots {
		c.drop("cpu/numa", "the cells hold %d of the %d vCPUs: every vCPU of a vmsup VM is on a node", len(owned), slots)
		return 0, false
	}
	c.out.NUMA = out
	return sum, true
}

// memoryBacking maps huge pages (one size for all the guest's memory) and
// shared memory, which vmsup makes itself where a virtiofs share needs it.
func (c *converter) memoryBacking() {
	mb := c.dom.MemoryBacking
	if mb == nil {
		return
	}
	if hp := mb.MemoryHugePages; hp != nil {
		c.hugepages(hp)
	}
	if s := mb.MemorySource; s != nil && s.Type != "" && s.Type != "memfd" && s.Type != "anonymous" {
		c.drop("memoryBacking/source", "type %q: vmsup backs memory with anonymous memory, memfd when shared, or hugetlbfs", s.Type)
	}
	if a := mb.MemoryAccess; a != nil && a.Mode == "shared" && !c.hasVirtioFS() {
		c.drop("memoryBacking/access", "shared: vmsup shares the guest's memory only with a virtiofs share's virtiofsd")
	}
	for _, x := range []struct {
		el  string
		set bool
		why string
	}{{"nosharepages", mb.MemoryNosharepages != nil, "the host's KSM may merge the guest's pages"},
		{"locked", mb.MemoryLocked != nil, "vmsup does not lock the guest's memory in RAM"},
		{"allocation", mb.MemoryAllocation != nil, "vmsup maps the guest's memory on demand (hugetlbfs reserves its pages at start)"},
		{"discard", mb.MemoryDiscard != nil, "QEMU's default applies"}} {
		if x.set {
			c.drop("memoryBacking/"+x.el, "%s", x.why)
		}
	}
}

// preallocElement names the line on libvirt's preallocated huge pages.
const preallocElement = "memoryBacking/hugepages (prealloc)"

// hugepages maps the page size; pages of other sizes for some nodes are
// not in vmsup (one size backs all the memory).
func (c *converter) hugepages(hp *libvirtxml.DomainMemoryHugepages) {
	size := ""
	for i, p := range hp.Hugepages {
		b, err := bytesOf(p.Size, p.Unit)
		if p.Size == 0 {
			b, err = 2<<20, nil // libvirt's default: the host's default size
		}
		var s string
		switch {
		case err != nil:
		case b == 2<<20:
			s = spec.Hugepages2M
		case b == 1<<30:
			s = spec.Hugepages1G
		}
		el := fmt.Sprintf("memoryBacking/hugepages/page[%d]", i)
		switch {
		case s == "":
			c.drop(el, "%d %s pages: vmsup's hugepages are 2M or 1G", p.Size, p.Unit)
		case size != "" && s != size:
			c.drop(el, "%s pages for nodes %s: one page size (%s) backs all of a vmsup VM's memory", s, p.Nodeset, size)
		default:
			size = s
		}
	}
	if len(hp.Hugepages) == 0 {
		size = spec.Hugepages2M // the host's default size
		c.note("memoryBacking/hugepages", "no page size: vmsup uses 2M pages (the x86 default)")
	}
	c.out.Hugepages = size
	if size != "" {
		// libvirt's backends of huge pages have prealloc on, with NUMA
		// cells or without (its hugepages-default and -numa-default).
		c.note(preallocElement, "libvirt preallocates the guest's huge pages (prealloc=on: every page touched at start); vmsup reserves them at start and the guest touches them as it runs")
	}
}

// hasVirtioFS reports whether a filesystem device is virtiofs.
func (c *converter) hasVirtioFS() bool {
	if c.dom.Devices == nil {
		return false
	}
	for _, fs := range c.dom.Devices.Filesystems {
		if fs.Driver != nil && fs.Driver.Type == "virtiofs" {
			return true
		}
	}
	return false
}
