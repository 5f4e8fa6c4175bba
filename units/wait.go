package units

import (
	"context"
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
