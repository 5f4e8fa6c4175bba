package vsock

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// Step is the start step that takes the guest's CID.
const Step = "vsock"

// ErrLocalMigration: a migration on one host would need the CID twice at
// once.
var ErrLocalMigration = errors.New("vsock: a migration on one host cannot keep the guest's CID (the kernel lets one QEMU hold it): down and up the VM instead")

// ForRoot is the CID table of the VMs under the vmsup root root, with the
// kernel's view of the CIDs held outside it.
func ForRoot(root string) Allocator {
	return Allocator{Dir: filepath.Join(root, "vsock"), InUse: KernelInUse(Device)}
}

// Start is vsock's part of a VM's start.
type Start struct{ Allocator }

var (
	_ startplan.Contributor = Start{}
	_ startplan.Reuser      = Start{}
)

// Steps checks the vhost-vsock device and takes a CID for a VM with vsock,
// allocated under the table's lock and kept for the VM until vmsup rm (so
// there is nothing to undo).
func (s Start) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	vm := &f.VM
	if !vm.Vsock.On() {
		return nil
	}
	field := "vsock"
	if vm.Vsock.CID != 0 {
		field = "vsock.cid"
	}
	return []steps.Step{{Name: Step, Do: func(ctx context.Context) error {
		if _, err := os.Stat(Device); err != nil {
			return f.Errorf("vsock", "%s is missing (modprobe vhost_vsock)", Device)
		}
		cid, err := s.Acquire(ctx, vm.Name, uint32(vm.Vsock.CID))
		var inUse *InUseError
		if errors.As(err, &inUse) {
			return f.Errorf(field, "%v", err)
		}
		if err != nil {
			return f.Errorf(field, "allocate a CID: %v", err)
		}
		plan.VsockCID = cid
		plan.AddArgv(func(o *qemuargs.Options) { o.VsockCID = cid })
		return nil
	}}}
}

// Reuse refuses a local migration of a VM with vsock (ErrLocalMigration).
func (s Start) Reuse(f *spec.File, _ *startplan.Plan) error {
	if f.VM.Vsock.On() {
		return ErrLocalMigration
	}
	return nil
}
