package apply

import (
	"context"
	"path/filepath"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/ops/hotplug"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// GateWaiting is told, while a restart's health gate waits for the new
// guest, how long it has waited, its bound and what it waits for.
type GateWaiting = machine.GateWaiting

// EventApplied is the lifecycle event of an apply that changed the VM.
const EventApplied = "applied"

// Applier plans and applies files, and resizes, on the VMs of one
// environment (machine.Env), as operations of its kernel.
type Applier struct {
	k   *operation.Kernel
	env *machine.Env
	// unit is the running unit and its monitor (env; tests give their
	// own), actual the vCPUs and memory QEMU has (qdev.Actual).
	unit   unit
	actual func(ctx context.Context, c *qmp.Conn) (cpus int, mem spec.Size, err error)
}

// unit is the one part of the Env apply's unit tests stand in for: the
// VM's monitor, its unit's cgroup limits and its autostart mark.
type unit interface {
	// QMPSession connects to the VM's command monitor, one client at a
	// time; release lets it go.
	QMPSession(ctx context.Context, vm string) (c *qmp.Conn, release func(), err error)
	// SetUnitLimits changes the running unit's cgroup limits (nil fields
	// stay as they are).
	SetUnitLimits(ctx context.Context, vm string, l units.Limits) error
	// Enable marks files for autostart; Disable drops the VMs' marks.
	Enable(ctx context.Context, files ...*spec.File) ([]machine.EnableResult, error)
	Disable(ctx context.Context, names ...string) error
}

// envUnit is the Env as apply's unit.
type envUnit struct{ *machine.Env }

func (e envUnit) SetUnitLimits(ctx context.Context, vm string, l units.Limits) error {
	sd, err := e.Systemd(ctx)
	if err != nil {
		return err
	}
	return sd.SetLimits(ctx, e.State().UnitOf(vm), l)
}

// New returns the applier on env's VMs, its operations run through env's
// kernel.
func New(env *machine.Env) *Applier {
	return &Applier{k: env.Ops(), env: env, unit: envUnit{env}, actual: qdev.Actual}
}

// hotplug is the hot-plug engine, for the disks and NICs of a file.
func (a *Applier) hotplug() *hotplug.Engine { return hotplug.New(a.env) }

// state is the state root: paths, records, pending changes.
func (a *Applier) state() vmstore.Store { return a.env.State() }

// restart restarts the VM with f, health-gated (the previous spec comes
// back on failure); restarted says a new QEMU runs f.
func (a *Applier) restart(ctx context.Context, f *spec.File, waiting GateWaiting) (restarted bool, err error) {
	r, err := a.env.RestartWith(ctx, f, machine.RestartOptions{Waiting: waiting})
	return r.Action == machine.Restarted, err
}

// Register registers the recoverers of apply's own operations (a
// setting's change, a resize) with the kernel.
func (a *Applier) Register() {
	a.k.Register(opApplySet, a.recoverApplySet)
	a.k.Register(opResize, a.recoverResize)
}

// lock takes the VM's lock for command by (borrowed in a context Holding
// it: an apply's own changes), having settled what a killed command left.
func (a *Applier) lock(ctx context.Context, vm, by string) (*operation.Lock, error) {
	lk, _, err := a.k.Lock(ctx, vm, by)
	return lk, err
}

func (a *Applier) paths(vm string) vmstore.Paths { return a.state().Paths(vm) }

func absPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}
