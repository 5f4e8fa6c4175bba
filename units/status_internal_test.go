package units

import "testing"

// TestStatusExists: a unit systemd lost the file of on a daemon-reload
// ("not-found") but whose process still runs exists; one that is neither
// loaded nor active does not.
func TestStatusExists(t *testing.T) {
	for _, c := range []struct {
		load, active string
		want         bool
	}{
		{"loaded", "active", true},
		{"not-found", "active", true},
		{"not-found", "deactivating", true},
		{"not-found", "inactive", false},
		{"loaded", "inactive", true},
	} {
		if got := statusFrom("u.service", map[string]any{"LoadState": c.load, "ActiveState": c.active}).Exists; got != c.want {
			t.Errorf("%s/%s: Exists %v, want %v", c.load, c.active, got, c.want)
		}
	}
}
