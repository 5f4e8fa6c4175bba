package confine

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Step is the start step that confines the VM's QEMU.
const Step = "confine"

// Start is confinement's part of a VM's start.
type Start struct {
	// Manager is called when a step needs it, not when the pipeline is
	// built: making one reads host facts, which may probe the host.
	Manager func() *Manager
}

var (
	_ startplan.Contributor = Start{}
	_ startplan.Reuser      = Start{}
)

// Steps copies the boot files QEMU boots from into the state directory
// (BootStep), prepares the VM's confinement (QEMU's user, file access,
// AppArmor) for what QEMU will really open (the boot disks, carried and
// moved ones too) and gives the unit its sandbox.
func (s Start) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	return []steps.Step{s.bootStep(f, plan), {Name: Step, Do: func(ctx context.Context) error {
		m := s.Manager()
		boot := plan.Boot.File(f)
		c, err := m.Confine(ctx, boot, plan.Paths, plan.Accel)
		if err != nil {
			return err
		}
		sb := m.Sandbox(boot, plan.Paths, c)
		plan.AddUnit(func(u *units.Unit) { u.Sandbox = sb })
		return nil
	}, Undo: func(ctx context.Context) { _ = s.Manager().Teardown(ctx, f.VM.Name) }}}
}

// Reuse: a local migration's new QEMU runs as the running one's user, in
// the sandbox its confinement record gives, and boots from the running
// one's copies of the boot files (made now where there are none).
func (s Start) Reuse(f *spec.File, plan *startplan.Plan) error {
	b, err := s.Manager().CopyBootFiles(f, plan.Paths, false, true)
	if err != nil {
		return err
	}
	plan.Boot.Kernel, plan.Boot.Initrd = b.Kernel, b.Initrd
	plan.AddUnit(func(u *units.Unit) {
		m := s.Manager()
		if c, err := m.Read(f.VM.Name); err == nil && c != nil {
			u.Sandbox = m.Sandbox(f, plan.Paths, c)
		}
	})
	return nil
}
