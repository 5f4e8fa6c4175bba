package apply

import (
	"context"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// GateWaiting is told, while a restart's health gate waits for the new
// guest, how long it has waited, its bound and what it waits for.
type GateWaiting = machine.GateWaiting

// Host is what plan, apply and resize need of the supervisor.
type Host interface {
	// State is the state root: paths, records, pending changes.
	State() vmstore.Store
	// View is the VM as it runs (vmstore.View). A VM without a record is
	// an error wrapping vmstore.ErrNotFound; one no QEMU runs comes back
	// with an error wrapping vmstore.ErrNotRunning.
	View(vm string) (*vmstore.View, error)
	// QMPSession connects to the VM's command monitor, one client at a
	// time; release lets it go.
	QMPSession(ctx context.Context, vm string) (c *qmp.Conn, release func(), err error)
	// AgentSession connects to the VM's guest agent, one client at a
	// time; release lets it go.
	AgentSession(ctx context.Context, vm string) (a *qmp.Agent, release func(), err error)

	// Validate checks f as up would; CheckOwner refuses f when its VM
	// belongs to another file (unless adopt); Adopt records f as the
	// file the VM belongs to.
	Validate(ctx context.Context, f *spec.File) error
	CheckOwner(f *spec.File, adopt bool) error
	Adopt(ctx context.Context, f *spec.File) error

	// ImageDirs are the image directories, the only places a running VM
	// can open new files; Unreachable is the first of paths it cannot
	// open ("" for none), Reachable the same as an error that says why.
	ImageDirs() []string
	Unreachable(paths ...string) string
	Reachable(paths ...string) error

	// The hot-plugs of a disk or NIC of the VM's file (or one the file no
	// longer has), recorded in the record's spec, not as attached by hand.
	AttachDisk(ctx context.Context, vm string, d spec.Disk) error
	DetachDisk(ctx context.Context, vm, disk string) error
	AttachNIC(ctx context.Context, vm string, n spec.NIC) error
	DetachNIC(ctx context.Context, vm, nic string) error
	// Restart restarts the VM with f, health-gated (the previous spec
	// comes back on failure); restarted says a new QEMU runs f. waiting,
	// when set, is told what the gate waits for while it waits.
	Restart(ctx context.Context, f *spec.File, waiting GateWaiting) (restarted bool, err error)

	// AppliedSpec is the spec the VM last started with; Enable marks f
	// for autostart, Disable drops the VM's mark.
	AppliedSpec(vm string) (*spec.File, error)
	Enable(ctx context.Context, f *spec.File) error
	Disable(ctx context.Context, vm string) error
	// ConfinePaths grants the running VM's QEMU more files; ReleasePaths
	// takes them back.
	ConfinePaths(ctx context.Context, vm string, rules ...units.PathRule) error
	ReleasePaths(ctx context.Context, vm string, paths ...string) error
	// SetNICFilters gives the running VM's network NICs the security
	// groups and anti-spoofing vm says, live.
	SetNICFilters(ctx context.Context, name string, vm *spec.VM) error
	// SetUnitLimits changes the running unit's cgroup limits (nil fields
	// stay as they are).
	SetUnitLimits(ctx context.Context, vm string, l units.Limits) error
	// TapRefusal says why the running VM cannot take a NIC on a host tap,
	// "" when it can (the NIC attach's own check).
	TapRefusal(vm string) string
	// UnplugTimeout bounds the wait for the guest to release a DIMM.
	UnplugTimeout() time.Duration
	// Lifecycle records a vmsup event of the VM.
	Lifecycle(vm, event string, data any)
}

// EventApplied is the lifecycle event of an apply that changed the VM.
const EventApplied = "applied"

// Applier plans and applies files, and resizes, on the VMs of one state
// root, as operations of kernel k.
type Applier struct {
	k *operation.Kernel
	h Host
	// actual is the vCPUs and memory QEMU has (qdev.Actual); tests
	// give their own.
	actual func(ctx context.Context, c *qmp.Conn) (cpus int, mem spec.Size, err error)
}

// New returns the applier on h's VMs, its operations run through k.
func New(k *operation.Kernel, h Host) *Applier {
	return &Applier{k: k, h: h, actual: qdev.Actual}
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

func (a *Applier) paths(vm string) vmstore.Paths { return a.h.State().Paths(vm) }

func absPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}
