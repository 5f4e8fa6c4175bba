package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/spec"
)

// storageSteps prepares the VM's disks: images, seeds, secrets.
func (s *Supervisor) storageSteps(f *spec.File, p vmPaths, plan *startPlan) []step {
	return nil
}

// storageTeardown undoes storageSteps once QEMU is gone; idempotent.
func (s *Supervisor) storageTeardown(ctx context.Context, name string) error {
	return nil
}
