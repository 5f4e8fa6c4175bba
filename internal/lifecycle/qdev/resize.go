package qdev

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// dimmAlign is the granularity of hot-plugged memory: Linux onlines x86
// memory in 128 MiB blocks.
const dimmAlign = 128 << 20

// SetCPUs plugs vCPUs until want run (0: leave) and returns how many run.
func SetCPUs(ctx context.Context, c *qmp.Conn, vm *spec.VM, want int) (int, error) {
	slots, err := c.QueryHotpluggableCPUs(ctx)
	if err != nil {
		return 0, fmt.Errorf("query-hotpluggable-cpus: %w", err)
	}
	have := 0
	var free []qmp.HotpluggableCPU
	for _, sl := range slots {
		if sl.QOMPath != "" {
			have += int(sl.VCPUsCount)
		} else {
			free = append(free, sl)
		}
	}
	switch {
	case want == 0 || want == have:
		return have, nil
	case want > vm.MaxCPUs:
		return have, fmt.Errorf("cpus %d is above max_cpus %d (max_cpus is fixed at start: raise it in the file and restart)", want, vm.MaxCPUs)
	case want < have:
		return have, fmt.Errorf("cpus %d: removing vCPUs from a running guest is not offered (QEMU 7.2 does not complete vCPU unplug under TCG); set cpus in the file and restart", want)
	}
	slices.SortFunc(free, func(a, b qmp.HotpluggableCPU) int {
		return cmp.Or(cmp.Compare(val(a.Props.SocketID), val(b.Props.SocketID)), cmp.Compare(val(a.Props.DieID), val(b.Props.DieID)),
			cmp.Compare(val(a.Props.CoreID), val(b.Props.CoreID)), cmp.Compare(val(a.Props.ThreadID), val(b.Props.ThreadID)))
	})
	for _, sl := range free {
		if have >= want {
			break
		}
		id := fmt.Sprintf("vcpu-s%dd%dc%dt%d", val(sl.Props.SocketID), val(sl.Props.DieID), val(sl.Props.CoreID), val(sl.Props.ThreadID))
		p := sl.Props
		slot := qemuargs.CPUSlot{NodeID: p.NodeID, SocketID: p.SocketID, DieID: p.DieID, ClusterID: p.ClusterID, CoreID: p.CoreID, ThreadID: p.ThreadID}
		if err := c.DeviceAdd(ctx, qemuargs.CPUDevice{Driver: sl.Type, ID: id, CPUSlot: slot}); err != nil {
			return have, fmt.Errorf("add vCPU %s: %w", id, err)
		}
		have += int(sl.VCPUsCount)
	}
	return have, nil
}

func val(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// dimm is one hot-plugged DIMM and its RAM backend.
type dimm struct {
	ID, Memdev string
	Size       int64
	N          int
}

// SetMemory adds one DIMM or removes hot-plugged ones (newest first) until
// the guest has want bytes (0: leave), and returns what it has. hugetlbfs
// is the mount the VM's memory is on (its hugepages, recorded at start), ""
// for ordinary memory: a new DIMM goes there too.
func SetMemory(ctx context.Context, c *qmp.Conn, vm *spec.VM, want spec.Size, hugetlbfs string, unplugTimeout time.Duration) (spec.Size, error) {
	sum, err := c.QueryMemorySizeSummary(ctx)
	if err != nil {
		return 0, fmt.Errorf("query-memory-size-summary: %w", err)
	}
	have := spec.Size(sum.BaseMemory + sum.PluggedMemory)
	switch {
	case want == 0 || want == have:
		return have, nil
	case want > vm.MaxMemory:
		return have, fmt.Errorf("memory %s is above max_memory %s (max_memory is fixed at start: raise it in the file and restart)", want, vm.MaxMemory)
	case want < vm.Memory:
		return have, fmt.Errorf("memory %s is below the %s the VM booted with; only hot-plugged memory can be removed", want, vm.Memory)
	}
	diff := int64(want) - int64(have)
	if diff%dimmAlign != 0 {
		return have, fmt.Errorf("memory can change only in steps of 128M (Linux onlines memory in 128 MiB blocks); %s -> %s is not", have, want)
	}
	if page := vm.HugepageSize(); page != 0 && diff%int64(page) != 0 {
		return have, fmt.Errorf("memory can change only in whole %s hugepages; %s -> %s is not", vm.Hugepages, have, want)
	}
	dimms, err := hotpluggedDIMMs(ctx, c)
	if err != nil {
		return have, err
	}
	if diff > 0 {
		n := 0
		for _, d := range dimms {
			n = max(n, d.N+1)
		}
		backend, dev := qemuargs.DIMM("dimm"+strconv.Itoa(n), diff, qemuargs.MemoryPlace{Hugetlbfs: hugetlbfs, Shared: vm.HasVirtioFS()})
		if err := c.ObjectAdd(ctx, backend); err != nil {
			return have, fmt.Errorf("add memory backend: %w", err)
		}
		if err := c.DeviceAdd(ctx, dev); err != nil {
			_ = c.ObjectDel(ctx, backend.ID)
			return have, fmt.Errorf("add DIMM: %w", err)
		}
		return want, nil
	}
	// Remove whole DIMMs, newest first, that add up to exactly -diff.
	slices.SortFunc(dimms, func(a, b dimm) int { return cmp.Compare(b.N, a.N) })
	var take []dimm
	for left := -diff; left > 0; {
		if len(take) == len(dimms) || dimms[len(take)].Size > left {
			var sizes []string
			for _, d := range dimms {
				sizes = append(sizes, spec.Size(d.Size).String())
			}
			return have, fmt.Errorf("memory %s: only whole hot-plugged DIMMs can be removed, newest first (plugged: %s)", want, cmp.Or(strings.Join(sizes, ", "), "none"))
		}
		left -= dimms[len(take)].Size
		take = append(take, dimms[len(take)])
	}
	for _, d := range take {
		if err := Unplug(ctx, c, "DIMM", d.ID, unplugTimeout); err != nil {
			return have, fmt.Errorf("remove DIMM %s: %w (Linux releases only memory onlined as movable)", d.ID, err)
		}
		if err := c.ObjectDel(ctx, d.Memdev); err != nil {
			return have, fmt.Errorf("remove memory backend %s: %w", d.Memdev, err)
		}
		have -= spec.Size(d.Size)
	}
	return have, nil
}

// hotpluggedDIMMs lists the DIMMs vmsup plugged (ids "dimmN").
func hotpluggedDIMMs(ctx context.Context, c *qmp.Conn) ([]dimm, error) {
	ds, err := c.QueryMemoryDevices(ctx)
	if err != nil {
		return nil, fmt.Errorf("query-memory-devices: %w", err)
	}
	var out []dimm
	for _, d := range ds {
		rest, ok := strings.CutPrefix(d.Data.ID, "dimm")
		n, err := strconv.Atoi(rest)
		if d.Type != "dimm" || !ok || err != nil {
			continue
		}
		memdev := d.Data.Memdev
		if i := strings.LastIndexByte(memdev, '/'); i >= 0 { // a QOM path: /objects/mem-dimmN
			memdev = memdev[i+1:]
		}
		out = append(out, dimm{ID: d.Data.ID, Memdev: memdev, Size: d.Data.Size, N: n})
	}
	return out, nil
}

// Actual is what the running QEMU has: vCPUs plugged and memory (boot plus
// DIMMs). A DIMM backend without its device (an add cut short) is removed
// on the way.
func Actual(ctx context.Context, c *qmp.Conn) (int, spec.Size, error) {
	slots, err := c.QueryHotpluggableCPUs(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("query-hotpluggable-cpus: %w", err)
	}
	cpus := 0
	for _, sl := range slots {
		if sl.QOMPath != "" {
			cpus += int(sl.VCPUsCount)
		}
	}
	dimms, err := hotpluggedDIMMs(ctx, c)
	if err != nil {
		return 0, 0, err
	}
	objs, err := c.QOMList(ctx, "/objects")
	if err != nil {
		return 0, 0, fmt.Errorf("qom-list /objects: %w", err)
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Name, "mem-dimm") && !slices.ContainsFunc(dimms, func(d dimm) bool { return d.Memdev == o.Name }) {
			if err := c.ObjectDel(ctx, o.Name); err != nil {
				return 0, 0, fmt.Errorf("remove the orphan memory backend %s: %w", o.Name, err)
			}
		}
	}
	sum, err := c.QueryMemorySizeSummary(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("query-memory-size-summary: %w", err)
	}
	return cpus, spec.Size(sum.BaseMemory + sum.PluggedMemory), nil
}
