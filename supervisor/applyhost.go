package supervisor

import (
	"context"
	"time"

	"github.com/vmsup/vmsup/internal/ops/apply"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Plan, apply and live resizes live in internal/ops/apply; here are its Host
// (applyHost) and the public API, one line each.

// PlanResult is what Plan found for one VM.
type PlanResult = apply.PlanResult

// PlanOptions change what PlanWith does.
type PlanOptions = apply.PlanOptions

// ApplyOptions say what apply does with the changes it cannot make live.
type ApplyOptions = apply.Options

// ApplyResult is what Apply did to one VM.
type ApplyResult = apply.Result

// ResizeOptions are the changes Resize makes; zero or nil fields are left as
// they are.
type ResizeOptions = apply.ResizeOptions

// ResizeResult is what the running VM has after Resize.
type ResizeResult = apply.ResizeResult

// Plan compares f with its running VM and says what apply would do.
func (s *Supervisor) Plan(ctx context.Context, f *spec.File) (PlanResult, error) {
	return s.PlanWith(ctx, f, PlanOptions{})
}

// PlanWith is Plan with options.
func (s *Supervisor) PlanWith(ctx context.Context, f *spec.File, o PlanOptions) (PlanResult, error) {
	return s.applier().Plan(ctx, f, o)
}

// Apply makes the running VM match f: the live changes at once, each on its
// own, in plan order; the rest by a restart (o.Restart), at the guest's next
// reboot, or recorded as pending. A change that cannot be applied at all
// makes it refuse the whole file before it does anything. A live change
// that fails stops it: the error says what was applied, and plan then shows
// what is left. Applying a file the VM already runs does nothing.
func (s *Supervisor) Apply(ctx context.Context, f *spec.File, o ApplyOptions) (ApplyResult, error) {
	return s.applier().Apply(ctx, f, o)
}

// Resize changes a running VM's vCPUs, memory and cgroup limits live
// (vmsup set). A vCPU count above max_cpus or memory above max_memory is
// refused, as is removing vCPUs and removing memory other than whole DIMMs
// added before. New vCPUs and memory are onlined in the guest through its
// agent where it runs (ResizeResult.Note says what it did, or what the
// guest must do). The change lasts as long as the running QEMU: the next up
// starts from the VM's file.
func (s *Supervisor) Resize(ctx context.Context, name string, o ResizeOptions) (ResizeResult, error) {
	return s.applier().Resize(ctx, name, o)
}

// applier is plan and apply on this supervisor's VMs.
func (s *Supervisor) applier() *apply.Applier { return apply.New(s.env.Ops(), applyHost{s}) }

// SetNICFilters is the hook of apply's live filter changes (vmnet.SetFilters).
func (h applyHost) SetNICFilters(ctx context.Context, name string, vm *spec.VM) error {
	return h.s.env.Net().SetFilters(ctx, name, vm)
}

// applyHost is the supervisor as internal/ops/apply's Host.
type applyHost struct{ s *Supervisor }

var _ apply.Host = applyHost{}

func (h applyHost) State() vmstore.Store                  { return h.s.env.State() }
func (h applyHost) View(vm string) (*vmstore.View, error) { return h.s.env.View(vm) }
func (h applyHost) Validate(ctx context.Context, f *spec.File) error {
	return h.s.ValidateContext(ctx, f)
}
func (h applyHost) CheckOwner(f *spec.File, adopt bool) error     { return h.s.env.CheckOwner(f, adopt) }
func (h applyHost) Adopt(ctx context.Context, f *spec.File) error { return h.s.env.Adopt(ctx, f) }
func (h applyHost) ImageDirs() []string                           { return h.s.env.Opts().ImageDirs }
func (h applyHost) Unreachable(paths ...string) string            { return h.s.env.Unreachable(paths...) }
func (h applyHost) Reachable(paths ...string) error               { return h.s.env.Reachable(paths...) }
func (h applyHost) AppliedSpec(vm string) (*spec.File, error)     { return h.s.AppliedSpec(vm) }
func (h applyHost) Disable(ctx context.Context, vm string) error  { return h.s.Disable(ctx, vm) }
func (h applyHost) UnplugTimeout() time.Duration                  { return h.s.env.Opts().UnplugTimeout }
func (h applyHost) TapRefusal(vm string) string                   { return h.s.hotplug().TapRefusal(vm) }
func (h applyHost) Lifecycle(vm, event string, data any)          { h.s.env.Lifecycle(vm, event, data) }

func (h applyHost) QMPSession(ctx context.Context, vm string) (*qmp.Conn, func(), error) {
	return h.s.env.QMPSession(ctx, vm)
}
func (h applyHost) AgentSession(ctx context.Context, vm string) (*qmp.Agent, func(), error) {
	return h.s.env.AgentSession(ctx, vm)
}

// The hot-plugs of the VM's file (fromFile: recorded in the record's spec,
// not as attached by hand).
func (h applyHost) AttachDisk(ctx context.Context, vm string, d spec.Disk) error {
	_, err := h.s.hotplug().AttachDisk(ctx, vm, d, true)
	return err
}
func (h applyHost) DetachDisk(ctx context.Context, vm, disk string) error {
	return h.s.hotplug().DetachDisk(ctx, vm, disk, true)
}
func (h applyHost) AttachNIC(ctx context.Context, vm string, n spec.NIC) error {
	_, err := h.s.hotplug().AttachNIC(ctx, vm, n, true)
	return err
}
func (h applyHost) DetachNIC(ctx context.Context, vm, nic string) error {
	return h.s.hotplug().DetachNIC(ctx, vm, nic, true)
}

func (h applyHost) Restart(ctx context.Context, f *spec.File, waiting GateWaiting) (bool, error) {
	r, err := h.s.RestartWith(ctx, f, RestartOptions{Waiting: waiting})
	return r.Action == Restarted, err
}

func (h applyHost) Enable(ctx context.Context, f *spec.File) error {
	_, err := h.s.Enable(ctx, f)
	return err
}

func (h applyHost) ConfinePaths(ctx context.Context, vm string, rules ...units.PathRule) error {
	return h.s.ConfinePaths(ctx, vm, rules...)
}

func (h applyHost) ReleasePaths(ctx context.Context, vm string, paths ...string) error {
	return h.s.ReleasePaths(ctx, vm, paths...)
}

func (h applyHost) SetUnitLimits(ctx context.Context, vm string, l units.Limits) error {
	sd, err := h.s.env.Systemd(ctx)
	if err != nil {
		return err
	}
	return sd.SetLimits(ctx, h.s.env.State().UnitOf(vm), l)
}
