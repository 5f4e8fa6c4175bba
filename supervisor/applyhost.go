package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/ops/apply"
	"github.com/vmsup/vmsup/spec"
)

// Plan, apply and live resizes live in internal/ops/apply; here is the
// public API, one line each.

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
func (s *Supervisor) applier() *apply.Applier { return apply.New(s.env) }
