package units

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// WaitGone waits (until ctx ends) for nothing to run in the unit any more:
// gone, inactive or failed.
func (m *Manager) WaitGone(ctx context.Context, unit string) {
	for ctx.Err() == nil {
		st, err := m.activeState(ctx, unit)
		if err != nil || st == "inactive" || st == "failed" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitStopped waits for the unit to be gone or inactive; a failed one (a
// killed unit ends failed) is reset so that its name is free.
func (m *Manager) WaitStopped(ctx context.Context, unit string) error {
	for {
		st, err := m.activeState(ctx, unit)
		switch {
		case err != nil:
			return err
		case st == "inactive":
			return nil // an inactive transient unit is collected by systemd
		case st == "failed":
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

// WaitSettled waits, until ctx ends, for the unit to leave a transition
// (activating, deactivating, reloading): a start or stop systemd is still
// carrying out for a command that was killed. It returns the state then.
func (m *Manager) WaitSettled(ctx context.Context, unit string) (string, error) {
	for {
		st, err := m.activeState(ctx, unit)
		if err != nil || (st != "activating" && st != "deactivating" && st != "reloading") {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Ended reports whether the unit's main process is over: the unit is
// inactive, failed or unknown to systemd (Status.Gone). It reads the
// unit's ActiveState alone, for a wait that asks often; Status then says
// how it ended.
func (m *Manager) Ended(ctx context.Context, unit string) (bool, error) {
	st, err := m.activeState(ctx, unit)
	return st == "inactive" || st == "failed", err
}

// activeState is the unit's ActiveState alone ("inactive" for a unit
// systemd does not know). A wait asks for one property where Status asks
// for all of a service's, some hundreds: a hundred downs waiting at once
// made that PID 1's main work, and slowed the stops they waited for.
func (m *Manager) activeState(ctx context.Context, unit string) (string, error) {
	p, err := m.conn.GetUnitPropertyContext(ctx, unit, "ActiveState")
	if isNoSuchUnit(err) {
		return "inactive", nil
	} else if err != nil {
		return "", fmt.Errorf("unit %s: %w", unit, err)
	}
	s, _ := p.Value.Value().(string)
	return s, nil
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
