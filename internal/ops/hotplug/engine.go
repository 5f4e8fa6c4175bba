package hotplug

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
)

// Engine runs the hot-plugs of the VMs of one environment (machine.Env):
// its state root, operation kernel, host places, network and confinement.
type Engine struct {
	k   *operation.Kernel
	env *machine.Env
	// mon is the VMs' monitors (env; tests give their own), and QEMU's
	// answers to a recovery (qdev.Query, qdev.FinishUnplug).
	mon    monitor
	query  func(ctx context.Context, c *qmp.Conn) (qdev.Present, error)
	finish func(ctx context.Context, c *qmp.Conn, id string, timeout time.Duration) (gone bool, err error)
}

// monitor is the one part of the Env the engine's unit tests stand in for:
// a QMP session on the VM's monitor (machine.Env.QMPSession).
type monitor interface {
	QMPSession(ctx context.Context, vm string) (c *qmp.Conn, release func(), err error)
}

// New returns the engine on env's VMs, running its operations on env's
// kernel.
func New(env *machine.Env) *Engine {
	return &Engine{k: env.Ops(), env: env, mon: env, query: qdev.Query, finish: qdev.FinishUnplug}
}

// state is the state root: the VMs' paths and records.
func (e *Engine) state() vmstore.Store { return e.env.State() }

// unplugTimeout bounds the wait for the guest to release a device.
func (e *Engine) unplugTimeout() time.Duration { return e.env.Opts().UnplugTimeout }

func (e *Engine) logger() *slog.Logger { return e.env.Opts().Logger }

// qemuPID is the VM's QEMU in this PID namespace (0: none).
func (e *Engine) qemuPID(vm string) int { return vmstore.QEMUPID(vm, e.env.Paths(vm).QMP) }

// Register registers with the engine's kernel the recoverers of every
// kind's attach and detach.
func (e *Engine) Register() {
	for _, kd := range kinds() {
		e.k.Register(kd.attach, e.recoverAttach(kd))
		e.k.Register(kd.detach, e.recoverDetach(kd))
	}
}

// kind is one kind of device: its two operations in the journal and how a
// device of it is read back from its operation's intent (recovery).
type kind struct {
	attach, detach operation.Kind
	load           func(e *Engine, vm string, o *operation.Op) (Device, error)
}

func kinds() []kind { return []kind{diskKind(), nicKind(), hostDevKind()} }

// The steps every hot-plug journals, and those of the kinds' own lists
// that more than one kind has; Device.Step names them for its device
// (`disk "data": record`).
const (
	stepRecord    operation.Step = "record"    // an attach's last: the record holds the device
	stepUnplugged operation.Step = "unplugged" // the guest released it, its parts are gone
	stepReleased  operation.Step = "released"  // its host side is taken back
	stepConfine   operation.Step = "confine"   // its files or nodes granted to QEMU
	stepDeviceAdd operation.Step = "device_add"
)

// Device is one device of a kind as its operation's intent names it: all
// the one attach, detach and recovery need to know of it.
type Device interface {
	// Label names it in messages: disk "data", nic "n1", host device
	// 0000:01:00.0.
	Label() string
	// Step is the journal's marker of step s for this device (s one of
	// the steps above, or of its kind's).
	Step(s operation.Step) operation.Step
	// Intent is what its operation journals before it acts.
	Intent() any
	// ID is its PCI device in QEMU, by which QEMU says whether the guest
	// has it ("" when it has none).
	ID() string
	// Recorded reports whether the VM's record holds it.
	Recorded(app *vmstore.Applied) bool
	// Record adds it to the VM's record; pr, when not nil, is what QEMU
	// has (a recovery adopting a device the guest got).
	Record(app *vmstore.Applied, pr *qdev.Present) error
	// Forget drops it from the VM's record.
	Forget(app *vmstore.Applied) error
	// Unplug takes it out of QEMU: the guest releases its device
	// (qdev.Unplug), then its other parts go.
	Unplug(ctx context.Context, c *qmp.Conn) error
	// RemoveParts removes what QEMU still has of it (pr) once it is not
	// in the guest.
	RemoveParts(ctx context.Context, c *qmp.Conn, pr qdev.Present) error
	// Release takes its host side back once it left QEMU (a detach: its
	// data stays).
	Release(ctx context.Context) error
	// Undo takes back everything its attach made on the host, the files it
	// created too (an attach rolled back); note says what went.
	Undo(ctx context.Context) (note string, err error)
}

// Plug is a device being attached: the steps that plug it.
type Plug interface {
	Device
	// HostSteps are its host side, each with its undo. op is its
	// operation, for an intent that learns more as they go.
	HostSteps(op *operation.Op) []steps.Step
	// Parts are the steps that add its parts over QMP, in order, each
	// with its undo; made once the host steps are done.
	Parts() ([]steps.Step, error)
}

// attachRequest is an attach as its kind checks it.
type attachRequest interface {
	kind() kind
	// fail is the error its caller gets for err (nil for nil).
	fail(err error) error
	// check checks the device against the VM (v) and the host, touching
	// nothing. down says that no QEMU runs the VM (nil when one does): a
	// kind that attaches to a VM shut off records the device there and
	// is done.
	check(ctx context.Context, v *vmstore.View, down error) (done bool, err error)
	// plug is the device to plug into root port bus of QEMU (c).
	plug(ctx context.Context, v *vmstore.View, c *qmp.Conn, bus string) (Plug, error)
}

// detachRequest is a detach as its kind checks it.
type detachRequest interface {
	kind() kind
	fail(err error) error
	// find is the device to take out of the VM (v). down says that no
	// QEMU runs the VM: a kind that detaches from a VM shut off drops the
	// device from its record there and returns none.
	find(ctx context.Context, v *vmstore.View, down error) (Device, error)
}

// attach is the one attach: under the VM's lock, the kind's checks, a free
// root port, then as one operation of the kernel the device's host steps,
// its parts and its record (attachSteps).
func (e *Engine) attach(ctx context.Context, vm string, r attachRequest) error {
	kd := r.kind()
	lk, _, err := e.k.Lock(ctx, vm, string(kd.attach))
	if err != nil {
		return err
	}
	defer lk.Unlock()
	v, err := e.env.View(vm)
	down := notRunning(v, err)
	if err != nil && down == nil {
		return r.fail(err)
	}
	if done, err := r.check(ctx, v, down); done || err != nil {
		return r.fail(err)
	}
	c, release, err := e.mon.QMPSession(ctx, vm)
	if err != nil {
		return r.fail(err)
	}
	defer release()
	bus, err := qdev.FreeRootPort(ctx, c, v.Booted, v.Applied.HotplugPorts)
	if err != nil {
		return r.fail(err)
	}
	p, err := r.plug(ctx, v, c, bus)
	if err != nil {
		return r.fail(err)
	}
	op, err := e.k.Begin(ctx, vm, kd.attach, p.Intent())
	if err != nil {
		return r.fail(err)
	}
	defer op.End() // done or undone here; a kill leaves it to recover
	return r.fail(e.attachSteps(ctx, vm, p, v.Applied, op))
}

// attachSteps runs the device's host steps, then its parts and last its
// record, so that the record and the VM agree; a failed step undoes the
// ones before it.
func (e *Engine) attachSteps(ctx context.Context, vm string, p Plug, app *vmstore.Applied, op *operation.Op) error {
	undo, err := steps.Run(ctx, vm, p.HostSteps(op), op.After())
	if err != nil {
		return err
	}
	list, err := p.Parts()
	if err != nil {
		undo(ctx)
		return err
	}
	list = append(list, steps.Step{Name: string(p.Step(stepRecord)), Do: func(context.Context) error {
		if err := p.Record(app, nil); err != nil {
			return err
		}
		return e.state().RewriteApplied(app)
	}})
	if _, err := steps.Run(ctx, vm, list, op.After()); err != nil {
		undo(ctx)
		return err
	}
	return nil
}

// detach is the one detach: under the VM's lock, the device the kind
// finds, then as one operation of the kernel its unplug (the guest
// releases it, its parts go), its host side and its record (remove). A
// guest that does not release the device within the unplug timeout leaves
// it attached, and the error says so.
func (e *Engine) detach(ctx context.Context, vm string, r detachRequest) error {
	kd := r.kind()
	lk, _, err := e.k.Lock(ctx, vm, string(kd.detach))
	if err != nil {
		return err
	}
	defer lk.Unlock()
	v, err := e.env.View(vm)
	down := notRunning(v, err)
	if err != nil && down == nil {
		return r.fail(err)
	}
	d, err := r.find(ctx, v, down)
	if d == nil || err != nil {
		return r.fail(err)
	}
	op, err := e.k.Begin(ctx, vm, kd.detach, d.Intent())
	if err != nil {
		return r.fail(err)
	}
	defer op.End()
	c, release, err := e.mon.QMPSession(ctx, vm)
	if err != nil {
		return r.fail(err)
	}
	err = d.Unplug(ctx, c)
	release()
	if err != nil {
		return r.fail(err)
	}
	op.Step(d.Step(stepUnplugged))
	return r.fail(e.remove(ctx, vm, d, op))
}

// remove finishes a device that left QEMU: its host side is taken back,
// then the record forgets it. op journals the steps (nil in a recovery,
// which decides from QEMU and the record, not from its steps).
func (e *Engine) remove(ctx context.Context, vm string, d Device, op *operation.Op) error {
	if err := d.Release(ctx); err != nil {
		return err
	}
	if op != nil {
		op.Step(d.Step(stepReleased))
	}
	app, err := e.state().ReadApplied(vm)
	if err != nil {
		return err
	}
	if err := d.Forget(app); err != nil {
		return err
	}
	if err := e.state().RewriteApplied(app); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	return nil
}

// notRunning is the view's error when it says that no QEMU runs the VM
// (machine.Env.View), else nil.
func notRunning(v *vmstore.View, err error) error {
	if err != nil && v != nil && !v.Running {
		return err
	}
	return nil
}

// opErr is err within what (`attach disk "data"`) on VM vm; an error that
// already names the VM (a failed step's, a busy VM's) is returned as it is.
func opErr(vm, what string, err error) error {
	if err == nil || vmerr.Names(vm, err) {
		return err
	}
	return vmerr.Wrap(vm, fmt.Errorf("%s: %w", what, err))
}
