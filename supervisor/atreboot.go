package supervisor

import (
	"context"
)

// Changes at the guest's next reboot, with no resident process: apply
// (internal/ops/apply) records them as pending and tells QEMU to exit instead
// of resetting when the guest reboots. Here is the rest: the unit's
// stop-post hook finds the guest's reset as the reason in QEMU's event log
// and starts a guardian unit, which waits for the old unit to end and
// starts the VM from the pending file (apply's RebootFile), health-gated,
// the previous spec coming back on failure; a restart policy's guardian is
// the same. A guest that powers off stays off (its file applies at up).

// RebootApply is the guardian's work: once the old unit is gone, start the
// VM from its pending file (or, with none, the spec it ran), health-gated.
func (s *Supervisor) RebootApply(ctx context.Context, name string) (string, error) {
	return s.env.RebootApply(ctx, name, s.applier().RebootFile)
}
