package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/internal/lifecycle/guestagent"
	"github.com/vmsup/vmsup/internal/lifecycle/livesettings"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Live resource changes (vmsup set, and apply's cpus and memory): vCPUs
// and memory are hot-plugged over QMP within the ceilings the VM booted
// with (max_cpus, max_memory: QEMU fixes them at start), and cgroup limits
// are changed on the running unit. They last as long as the running QEMU:
// the VM's file stays the configuration, so the next up starts from it
// again (vmsup never rewrites a user's file).

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

// opResize is vmsup set's operation in the journal; its intent is the
// ResizeOptions.
const opResize operation.Kind = "set"

// Steps of vmsup set in the journal.
const (
	stepResizeCPUs   operation.Step = "cpus"
	stepResizeMemory operation.Step = "memory"
)

// Resize changes a running VM's vCPUs, memory and cgroup limits live. A
// vCPU count above max_cpus or memory above max_memory is refused, as is
// removing vCPUs (QEMU 7.2 does not complete vCPU unplug under TCG, and a
// later DIMM add crashed it: measured) and removing memory other than whole
// DIMMs added before. What it adds is onlined in the guest through its
// agent where it answers (guestagent.Online), since a guest without a rule
// for it (Debian has none) leaves it offline; the note says what the agent
// did, or what the guest must do. A DIMM the guest onlines as movable
// (memhp_default_state=online_movable, or online_policy=auto-movable for
// the agent's) is what it can release again.
func (a *Applier) Resize(ctx context.Context, name string, o ResizeOptions) (ResizeResult, error) {
	res, online, err := a.resize(ctx, name, o)
	res.Note = joinNotes(online, res.Note)
	return res, err
}

// resize is Resize, with the note of what was onlined in the guest apart
// ("" when nothing was added).
func (a *Applier) resize(ctx context.Context, name string, o ResizeOptions) (res ResizeResult, online string, err error) {
	res = ResizeResult{VM: name}
	fail := func(err error) (ResizeResult, string, error) { return res, "", fmt.Errorf("vm %q: set: %w", name, err) }
	lk, err := a.lock(ctx, name, "set")
	if err != nil {
		return res, "", err
	}
	defer lk.Unlock()
	v, err := a.env.View(name)
	if errors.Is(err, vmstore.ErrNotRunning) {
		return fail(errors.New("not running; change cpus and memory in its file, they apply at the next up"))
	}
	if err != nil {
		return fail(err)
	}
	app, vm := v.Applied, v.Booted
	cpus0, mem0 := vm.CPUs, vm.Memory
	if r := app.Resized; r != nil {
		cpus0, mem0 = r.CPUs, r.Memory
	}
	res.MaxCPUs, res.MaxMemory = vm.MaxCPUs, vm.MaxMemory
	if o.CPUQuota != nil || o.CPUWeight != nil {
		if err := a.unit.SetUnitLimits(ctx, name, units.Limits{CPUQuota: o.CPUQuota, CPUWeight: o.CPUWeight}); err != nil {
			return fail(err)
		}
	}
	c, release, err := a.unit.QMPSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	op, err := a.k.Begin(ctx, name, opResize, o)
	if err != nil {
		return fail(err)
	}
	defer op.End()
	_, cpuErr := qdev.SetCPUs(ctx, c, vm, o.CPUs)
	if cpuErr == nil && o.CPUs > 0 {
		// A new vCPU thread starts with the unit's affinity: pin it too.
		cpuErr = livesettings.PinVCPUs(ctx, c, vm, a.paths(name).QMP)
	}
	op.Step(stepResizeCPUs)
	var memErr error
	if cpuErr == nil {
		_, memErr = qdev.SetMemory(ctx, c, vm, o.Memory, app.Hugetlbfs, a.env.Opts().UnplugTimeout)
		op.Step(stepResizeMemory)
	}
	// What QEMU has now is recorded, whether all of it went or not.
	if res.CPUs, res.Memory, err = a.recordResize(ctx, c, app, vm); err != nil {
		return fail(errors.Join(cpuErr, memErr, err))
	}
	if err := errors.Join(cpuErr, memErr); err != nil {
		return fail(err)
	}
	if res.CPUs > cpus0 || res.Memory > mem0 {
		session := func(ctx context.Context) (*qmp.Agent, func(), error) { return a.env.AgentSession(ctx, name) }
		online = guestagent.Online(ctx, c, session, res.CPUs).Note
	}
	if app.Resized != nil {
		res.Note = fmt.Sprintf("live only: the next up starts with the file's cpus = %d, memory = %q", vm.CPUs, vm.Memory)
	}
	return res, online, nil
}

// joinNotes joins the notes that say something.
func joinNotes(notes ...string) string {
	return strings.Join(slices.DeleteFunc(notes, func(s string) bool { return s == "" }), "; ")
}

// recordResize records the vCPUs and memory the running QEMU has (a DIMM
// backend left without its device is removed first) and returns them.
func (a *Applier) recordResize(ctx context.Context, c *qmp.Conn, app *vmstore.Applied, vm *spec.VM) (int, spec.Size, error) {
	cpus, mem, err := a.actual(ctx, c)
	if err != nil {
		return 0, 0, err
	}
	app.Resized = nil
	if cpus != vm.CPUs || mem != vm.Memory {
		app.Resized = &vmstore.Resized{CPUs: cpus, Memory: mem}
	}
	if err := a.state().RewriteApplied(app); err != nil {
		return cpus, mem, fmt.Errorf("record: %w", err)
	}
	return cpus, mem, nil
}

// recoverResize settles a resize whose command died: whatever of it QEMU
// got is what the VM has now, so that is recorded.
func (a *Applier) recoverResize(ctx context.Context, name string, _ *operation.Op) (string, error) {
	v, err := a.env.View(name)
	if errors.Is(err, vmstore.ErrNotRunning) {
		return "QEMU is gone: nothing to reconcile", nil
	}
	if err != nil {
		return "", err
	}
	c, release, err := a.unit.QMPSession(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	cpus, mem, err := a.recordResize(ctx, c, v.Applied, v.Booted)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("recorded what QEMU has: %d vCPUs, %s", cpus, mem), nil
}
