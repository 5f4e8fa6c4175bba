package supervisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmsup/vmsup/internal/devices"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Live resource changes (vmsup set): vCPUs and memory are hot-plugged over
// QMP within the ceilings the VM booted with (max_cpus, max_memory: QEMU
// fixes them at start), and cgroup limits are changed on the running unit.
// They last as long as the running QEMU: the VM's file stays the
// configuration, so the next up starts from it again (vmsup never rewrites
// a user's file).

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
	defer lk.Unlock()
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
		if err := sd.SetLimits(ctx, s.state.UnitOf(name), units.Limits{CPUQuota: o.CPUQuota, CPUWeight: o.CPUWeight}); err != nil {
			return fail(err)
		}
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	if res.CPUs, err = devices.SetCPUs(ctx, c, vm, o.CPUs); err != nil {
		return fail(err)
	}
	if res.Memory, err = devices.SetMemory(ctx, c, vm, o.Memory, s.opts.UnplugTimeout); err != nil {
		return fail(err)
	}
	app.Resized = nil
	if res.CPUs != vm.CPUs || res.Memory != vm.Memory {
		app.Resized = &vmstate.Resized{CPUs: res.CPUs, Memory: res.Memory}
		res.Note = fmt.Sprintf("live only: the next up starts with the file's cpus = %d, memory = %q", vm.CPUs, vm.Memory)
	}
	if err := s.state.RewriteApplied(app); err != nil {
		return fail(fmt.Errorf("record: %w", err))
	}
	return res, nil
}
