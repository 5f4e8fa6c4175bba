package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/spec"
)

// securitySteps prepares the VM's confinement: QEMU user, file ownership, AppArmor.
func (s *Supervisor) securitySteps(f *spec.File, p vmPaths, plan *startPlan) []step {
	return nil
}

// securityTeardown undoes securitySteps once QEMU is gone; idempotent.
func (s *Supervisor) securityTeardown(ctx context.Context, name string) error {
	return nil
}
