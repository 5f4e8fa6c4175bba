package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/spec"
)

// networkSteps prepares the VM's NICs: taps, bridges, OVS ports, CNI.
func (s *Supervisor) networkSteps(f *spec.File, p vmPaths, plan *startPlan) []step {
	return nil
}

// networkTeardown undoes networkSteps once QEMU is gone; idempotent.
func (s *Supervisor) networkTeardown(ctx context.Context, name string) error {
	return nil
}
