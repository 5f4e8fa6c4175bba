package supervisor

import (
	"context"
	"errors"

	"github.com/vmsup/vmsup/internal/hugepages"
	"github.com/vmsup/vmsup/internal/identity"
	"github.com/vmsup/vmsup/internal/snapshot"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// startPlan collects what the host steps decide about QEMU's argv and unit
// (a secret file, a tap's name, a confinement setting) so the argv and unit
// steps that follow apply it.
type startPlan struct {
	argvOpts []func(*qemuargs.Options)
	unitOpts []func(*units.Unit)
	// carried are disks hot-plugged during an earlier run that this start
	// boots with (storage.go).
	carried []spec.Disk
	// moved are the disks of the file `vmsup disk move` put elsewhere
	// (diskmove.go), recorded again with the new run.
	moved map[string]vmstate.MovedDisk
	// tree is the VM's snapshot tree: the overlays snapshots put disks
	// on (snapshot.go); nil for a VM coming from another host.
	tree *snapshot.Tree
	// accel is the accelerator the start resolved (validate).
	accel spec.Accel
	// vsockCID and hugetlbfs are the guest's CID and memory mount
	// (vsock.go), recorded with the VM.
	vsockCID  uint32
	hugetlbfs string
}

// hostSteps are the steps that make the host ready for QEMU before its unit
// starts, in order, each with its undo. Each concern (storage, network,
// confinement) contributes its own steps from its own file.
func (s *Supervisor) hostSteps(f *spec.File, p vmstate.Paths, plan *startPlan) []step {
	steps := s.guestSteps(f, plan)
	steps = append(steps, s.storageSteps(f, p, plan)...)
	steps = append(steps, s.identitySteps(f, p)...)
	steps = append(steps, s.networkSteps(f, plan)...)
	steps = append(steps, s.hostDevSteps(f, p, plan)...) // before confine: it grants the nodes binding makes
	steps = append(steps, s.confineSteps(f, plan)...)
	return steps
}

// hostTeardown releases what hostSteps set up once QEMU is gone (after Down,
// a crash, or a stop through systemd). It must be idempotent.
func (s *Supervisor) hostTeardown(ctx context.Context, name string) error {
	return errors.Join(
		s.networkTeardown(ctx, name),
		s.hostDevTeardown(name),
		s.confiner().Teardown(ctx, name),
		s.storageTeardown(ctx, name),
		identity.RemoveCredentials(s.paths(name).Dir),
		hugepages.Host{}.RemoveVMDirs(name),
	)
}
