package units

import (
	"context"
	"syscall"
	"time"
)

// WaitGone waits (until ctx ends) for nothing to run in the unit any more:
// gone, inactive or failed.
func (m *Manager) WaitGone(ctx context.Context, unit string) {
	for ctx.Err() == nil {
		st, err := m.Status(ctx, unit)
		if err != nil || st.Gone() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitStopped waits for the unit to be gone or inactive; a failed one (a
// killed unit ends failed) is reset so that its name is free.
func (m *Manager) WaitStopped(ctx context.Context, unit string) error {
	for {
		st, err := m.Status(ctx, unit)
		if err != nil {
			return err
		}
		if st.Stopped() {
			return nil // an inactive transient unit is collected by systemd
		}
		if st.ActiveState == "failed" {
			// Killed units end failed; forget them so the name is free.
			return m.ResetFailed(ctx, unit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// KillAndWait ends a unit now: SIGKILL to all its processes, then a wait
// (until ctx ends) for nothing to run in it, then its failed state reset so
// that its name is free. A unit that does not run is left as it is. The
// one way vmsup kills a unit it no longer wants (an undone start, a
// guardian, a stuck QEMU).
func (m *Manager) KillAndWait(ctx context.Context, unit string) {
	st, err := m.Status(ctx, unit)
	if err != nil || !st.Exists {
		return
	}
	_ = m.Kill(ctx, unit, syscall.SIGKILL)
	m.WaitGone(ctx, unit)
	_ = m.ResetFailed(ctx, unit)
}
