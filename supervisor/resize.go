package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Live resource changes (vmsup set): vCPUs and memory are hot-plugged over
// QMP within the ceilings the VM booted with (max_cpus, max_memory: QEMU
// fixes them at start), and cgroup limits are changed on the running unit.
// They last as long as the running QEMU: the VM's file stays the
// configuration, so the next up starts from it again (vmsup never rewrites
// a user's file).

// dimmAlign is the granularity of hot-plugged memory: Linux onlines x86
// memory in 128 MiB blocks.
const dimmAlign = 128 << 20

// ResizeOptions are the changes Resize makes; zero or nil fields are left as
// they are.
type ResizeOptions struct {
	CPUs      int       // vCPUs: more are hot-plugged up to max_cpus
	Memory    spec.Size // guest RAM: DIMMs are added up to max_memory, or hot-plugged DIMMs removed
	CPUQuota  *int      // percent of one CPU; 0 removes the quota
	CPUWeight *int      // 1-10000
}

// ResizeResult is what the running VM has after Resize.
type ResizeResult struct {
	VM        string    `json:"vm"`
	CPUs      int       `json:"cpus"`
	MaxCPUs   int       `json:"max_cpus"`
	Memory    spec.Size `json:"memory"`
	MaxMemory spec.Size `json:"max_memory"`
	Note      string    `json:"note,omitempty"`
}

// resized is what Resize changed, kept in the VM's record while its QEMU
// runs (status shows it; migration refuses it: the destination would start
// without the hot-plugged devices).
type resized struct {
	CPUs   int       `json:"cpus"`
	Memory spec.Size `json:"memory"`
}

// Resize changes a running VM's vCPUs, memory and cgroup limits live. A
// vCPU count above max_cpus or memory above max_memory is refused, as is
// removing vCPUs (QEMU 7.2 does not complete vCPU unplug under TCG, and a
// later DIMM add crashed it: measured) and removing memory other than whole
// DIMMs added before. The guest must online new vCPUs and memory (Linux:
// udev rules or memhp_default_state=online_movable; online_movable is also
// what lets it release a DIMM again).
func (s *Supervisor) Resize(ctx context.Context, name string, o ResizeOptions) (ResizeResult, error) {
	res := ResizeResult{VM: name}
	fail := func(err error) (ResizeResult, error) { return res, fmt.Errorf("vm %q: set: %w", name, err) }
	lk, err := s.lock(ctx, name, "set")
	if err != nil {
		return res, err
	}
	defer lk.unlock()
	app, vm, err := s.runningSpec(name)
	if errors.Is(err, ErrNotRunning) {
		return fail(errors.New("not running; change cpus and memory in its file, they apply at the next up"))
	}
	if err != nil {
		return fail(err)
	}
	res.MaxCPUs, res.MaxMemory = vm.MaxCPUs, vm.MaxMemory
	if o.CPUQuota != nil || o.CPUWeight != nil {
		sd, err := s.systemd(ctx)
		if err != nil {
			return fail(err)
		}
		if err := sd.SetLimits(ctx, s.unitOf(name), units.Limits{CPUQuota: o.CPUQuota, CPUWeight: o.CPUWeight}); err != nil {
			return fail(err)
		}
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	if res.CPUs, err = s.setCPUs(ctx, c, vm, o.CPUs); err != nil {
		return fail(err)
	}
	if res.Memory, err = s.setMemory(ctx, c, vm, o.Memory); err != nil {
		return fail(err)
	}
	app.Resized = nil
	if res.CPUs != vm.CPUs || res.Memory != vm.Memory {
		app.Resized = &resized{CPUs: res.CPUs, Memory: res.Memory}
		res.Note = fmt.Sprintf("live only: the next up starts with the file's cpus = %d, memory = %q", vm.CPUs, vm.Memory)
	}
	if err := s.rewriteApplied(app); err != nil {
		return fail(fmt.Errorf("record: %w", err))
	}
	return res, nil
}

// cpuDevice is device_add's arguments for one vCPU.
type cpuDevice struct {
	Driver string `json:"driver"`
	ID     string `json:"id"`
	qmp.CPUInstanceProperties
}

// setCPUs plugs vCPUs until want run (0: leave) and returns how many run.
func (s *Supervisor) setCPUs(ctx context.Context, c *qmp.Conn, vm *spec.VM, want int) (int, error) {
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
		return cmp.Or(cmp.Compare(val(a.Props.SocketID), val(b.Props.SocketID)),
			cmp.Compare(val(a.Props.CoreID), val(b.Props.CoreID)), cmp.Compare(val(a.Props.ThreadID), val(b.Props.ThreadID)))
	})
	for _, sl := range free {
		if have >= want {
			break
		}
		id := fmt.Sprintf("vcpu-s%dc%dt%d", val(sl.Props.SocketID), val(sl.Props.CoreID), val(sl.Props.ThreadID))
		if err := c.DeviceAdd(ctx, cpuDevice{Driver: sl.Type, ID: id, CPUInstanceProperties: sl.Props}); err != nil {
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

type ramBackend struct {
	QOMType string `json:"qom-type"`
	ID      string `json:"id"`
	Size    int64  `json:"size"`
}

type dimmDevice struct {
	Driver string `json:"driver"`
	ID     string `json:"id"`
	Memdev string `json:"memdev"`
}

// setMemory adds one DIMM or removes hot-plugged ones (newest first) until
// the guest has want bytes (0: leave), and returns what it has.
func (s *Supervisor) setMemory(ctx context.Context, c *qmp.Conn, vm *spec.VM, want spec.Size) (spec.Size, error) {
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
	dimms, err := hotpluggedDIMMs(ctx, c)
	if err != nil {
		return have, err
	}
	if diff > 0 {
		n := 0
		for _, d := range dimms {
			n = max(n, d.N+1)
		}
		id := "dimm" + strconv.Itoa(n)
		mem := "mem-" + id
		if err := c.ObjectAdd(ctx, ramBackend{QOMType: "memory-backend-ram", ID: mem, Size: diff}); err != nil {
			return have, fmt.Errorf("add memory backend: %w", err)
		}
		if err := c.DeviceAdd(ctx, dimmDevice{Driver: "pc-dimm", ID: id, Memdev: mem}); err != nil {
			_ = c.ObjectDel(ctx, mem)
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
			return have, fmt.Errorf("memory %s: only whole hot-plugged DIMMs can be removed, newest first (plugged: %s)", want, orDefault(strings.Join(sizes, ", "), "none"))
		}
		left -= dimms[len(take)].Size
		take = append(take, dimms[len(take)])
	}
	for _, d := range take {
		if err := unplugDevice(ctx, c, d.ID, s.opts.UnplugTimeout); err != nil {
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
