// Package startplan is the contract between a VM's start pipeline (the
// supervisor's) and the concerns that make the host ready for its QEMU:
// disks, network, host devices, confinement, guest memory and vsock,
// credentials, and the companion units. Each concern is a Contributor: it
// adds its named steps, each with its undo, and while they run it hands
// the pipeline the options of QEMU's argv and unit as data, in the start's
// Plan. The pipeline's argv and unit steps apply them in one place.
//
// It holds no concern's logic, only what they share: the start's facts
// (mode, paths, unit, accelerator), the disks it boots with (Boot), and
// the options collected.
package startplan

import (
	"context"
	"errors"
	"slices"

	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Mode is what a start makes.
type Mode int

// Start modes.
const (
	// Fresh: a new QEMU running the guest from its file (up).
	Fresh Mode = iota
	// Incoming: a migration destination on another host than the source:
	// QEMU waits with -incoming, the host is made ready as for up.
	Incoming
	// IncomingLocal: a migration destination on the source's host: the new
	// QEMU runs under the VM's other unit name and reuses the host
	// resources the running one has (grants, namespace); what two QEMUs
	// cannot share (a tap) it gets its own of (Mover).
	IncomingLocal
)

func (m Mode) String() string {
	return [...]string{"fresh", "incoming", "incoming-local"}[m]
}

// Contributor is one concern's part of a start. Steps is called when the
// pipeline is built (listing a start's steps runs none of them); the steps
// run in the start, in order, after those of the concerns before, and may
// add argv and unit options to plan.
type Contributor interface {
	Steps(f *spec.File, plan *Plan) []steps.Step
}

// Reuser is a host concern's part of a local migration destination's
// start, which runs none of the host concerns' steps: Reuse gives the new
// QEMU's argv and unit what the running QEMU's steps made (from their
// records), or refuses what two QEMUs of one VM cannot share.
type Reuser interface {
	Reuse(f *spec.File, plan *Plan) error
}

// Mover is a host concern's part of a local migration beyond Reuse: what
// the new QEMU cannot share with the running one (a tap) is made for it by
// MoveSteps, after the reuse step, each with its undo. Once the migration
// is settled, CommitMove (the new QEMU runs the guest, the old one is
// gone) makes it the VM's and removes the old QEMU's, or AbortMove (the
// old QEMU keeps the guest) removes it. Both work from the concern's
// records alone and are idempotent: a killed migration's recovery calls
// them again.
type Mover interface {
	MoveSteps(f *spec.File, plan *Plan) []steps.Step
	CommitMove(ctx context.Context, vm string) error
	AbortMove(ctx context.Context, vm string) error
}

// Plan is one start as its concerns see it: the facts the pipeline
// resolves as it goes, and the options the concerns decide for QEMU's argv
// and unit. A field is set by the step that says so and read by later ones.
type Plan struct {
	Mode  Mode
	Paths vmstore.Paths // the VM's state paths
	// Unit is the QEMU's unit; final once the check step ran (a crashed
	// VM's unit may be another than the one it had).
	Unit string
	// Accel is the accelerator the start resolved (validate).
	Accel spec.Accel
	// Boot is what QEMU opens beyond the file's disks (state-dir).
	Boot Boot
	// VsockCID and Hugetlbfs are the guest's CID and its memory's
	// directory, recorded with the VM (vsock, hugepages).
	VsockCID  uint32
	Hugetlbfs string

	argv []func(*qemuargs.Options)
	unit []func(*units.Unit)
}

// AddArgv adds an option of QEMU's argv, applied in the argv step.
func (p *Plan) AddArgv(o func(*qemuargs.Options)) { p.argv = append(p.argv, o) }

// AddUnit adds an option of QEMU's unit, applied in the unit step: a
// function, so that it reads what later steps decide.
func (p *Plan) AddUnit(o func(*units.Unit)) { p.unit = append(p.unit, o) }

// ArgvOptions are the argv options added so far, in order.
func (p *Plan) ArgvOptions() []func(*qemuargs.Options) { return slices.Clone(p.argv) }

// ApplyUnit applies the unit options added so far to u, in order.
func (p *Plan) ApplyUnit(u *units.Unit) {
	for _, o := range p.unit {
		o(u)
	}
}

// Steps lists every contributor's steps, in order.
func Steps(f *spec.File, plan *Plan, cs ...Contributor) []steps.Step {
	var out []steps.Step
	for _, c := range cs {
		out = append(out, c.Steps(f, plan)...)
	}
	return out
}

// Reuse runs the Reuse of those of cs that are Reusers, in order; the
// first refusal ends it.
func Reuse(f *spec.File, plan *Plan, cs ...Contributor) error {
	for _, c := range cs {
		if r, ok := c.(Reuser); ok {
			if err := r.Reuse(f, plan); err != nil {
				return err
			}
		}
	}
	return nil
}

// MoveSteps lists the MoveSteps of those of cs that are Movers, in order.
func MoveSteps(f *spec.File, plan *Plan, cs ...Contributor) []steps.Step {
	var out []steps.Step
	for _, c := range cs {
		if m, ok := c.(Mover); ok {
			out = append(out, m.MoveSteps(f, plan)...)
		}
	}
	return out
}

// EndMove ends a local migration of vm for those of cs that are Movers:
// CommitMove if the new QEMU runs the guest (moved), else AbortMove.
func EndMove(ctx context.Context, vm string, moved bool, cs ...Contributor) error {
	var errs []error
	for _, c := range cs {
		m, ok := c.(Mover)
		switch {
		case !ok:
		case moved:
			errs = append(errs, m.CommitMove(ctx, vm))
		default:
			errs = append(errs, m.AbortMove(ctx, vm))
		}
	}
	return errors.Join(errs...)
}

// Boot is what a start opens beyond its file's disks as written: the disks
// `vmsup disk move` put elsewhere, the disks hot-plugged during an earlier
// run that it boots with (carried), and the snapshot overlays disks are on;
// and the copies of its kernel and initrd QEMU boots from.
type Boot struct {
	Carried []spec.Disk
	Moved   map[string]vmstore.MovedDisk
	Tree    *snapshottree.Tree // nil for a VM coming from another host
	// Kernel and Initrd are the copies of the file's boot.kernel and
	// boot.initrd in the VM's state directory (the boot-files step,
	// internal/lifecycle/confine); "" until that step, or without one.
	Kernel, Initrd string
}

// Disks are the disks a start of vm opens (vmstore.OpenedDisks, the rule
// the running view has too): the file's, moved ones where they are, then
// the carried ones, each on its snapshot overlay.
func (b Boot) Disks(vm *spec.VM) []vmstore.Disk {
	app := &vmstore.Applied{Moved: b.Moved}
	for _, d := range b.Carried {
		app.Attached = append(app.Attached, vmstore.AttachedDisk{Disk: d})
	}
	return vmstore.OpenedDisks(vm.Disks, app, b.Tree)
}

// OwnImages maps each disk of vm a start opens on a snapshot's overlay to
// its own image: the snapshots' images between them are what a removal
// commits into (diskfds.Pass gives QEMU them read-write too).
func (b Boot) OwnImages(vm *spec.VM) map[string]string {
	out := map[string]string{}
	for _, od := range b.Disks(vm) {
		if od.Type == spec.DiskFile && od.Active.Path != "" && od.Active.Path != od.File {
			out[od.Name] = od.File
		}
	}
	return out
}

// File returns f as QEMU boots it: each disk opened where Disks says, the
// kernel and initrd from their copies (f itself when nothing applies).
func (b Boot) File(f *spec.File) *spec.File {
	disks := len(b.Carried) > 0 || (b.Tree != nil && !b.Tree.Empty()) || len(b.Moved) > 0
	if !disks && b.Kernel == "" && b.Initrd == "" {
		return f
	}
	g := *f
	if b.Kernel != "" {
		g.VM.Boot.Kernel = b.Kernel
	}
	if b.Initrd != "" {
		g.VM.Boot.Initrd = b.Initrd
	}
	if !disks {
		return &g
	}
	g.VM.Disks = nil
	for _, d := range b.Disks(&f.VM) {
		g.VM.Disks = append(g.VM.Disks, d.Opened())
	}
	return &g
}
