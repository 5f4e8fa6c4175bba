package machine

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/livesettings"
)

// Settings QEMU takes over QMP only (I/O limits, links, vCPU pinning, the
// balloon) are internal/ops/apply's (livesettings.Runtime): the start pipeline gives
// them right after QEMU answers, and records the VM without them until
// then, so that a start killed in between leaves a record that says what
// QEMU has.

// StepLive is the start step that gives QEMU the QMP-only settings.
const StepLive = "live-settings"

// liveStep is the start pipeline's StepLive for a fresh start: the
// settings, then the record with them.
func (r *startRun) liveStep(ctx context.Context) error {
	c, release, err := r.s.QMPSession(ctx, r.name)
	if err != nil {
		return err
	}
	err = livesettings.Runtime(ctx, c, &r.f.VM, r.sock.QMP)
	release()
	if err != nil {
		return err
	}
	r.app.SetVM(&r.f.VM)
	return r.s.state.RewriteApplied(r.app)
}
