package units

import (
	"context"
	"fmt"
)

// StartWithout starts u like Start, minus every property named in drop
// (both SystemCallFilter= assignments go together). Test-only: the
// sandbox start-cost measurement (sandbox_perf_test.go).
func (m *Manager) StartWithout(ctx context.Context, u Unit, drop map[string]bool) error {
	props, err := u.properties()
	if err != nil {
		return err
	}
	var kept = props[:0:0]
	for _, p := range props {
		if !drop[p.Name] {
			kept = append(kept, p)
		}
	}
	ch := make(chan string, 1)
	if _, err := m.conn.StartTransientUnitContext(ctx, u.Name, "fail", kept, ch); err != nil {
		return fmt.Errorf("unit %s: start: %w", u.Name, err)
	}
	return waitJob(ctx, u.Name, "start", ch)
}
