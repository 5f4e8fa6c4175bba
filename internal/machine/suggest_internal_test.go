package machine

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNearNames(t *testing.T) {
	known := []string{"db", "web", "web2", "worker"}
	for _, c := range []struct {
		name string
		want []string
	}{
		{"wbe", []string{"web"}}, // a swap
		{"we", []string{"web"}},  // one letter short
		{"weg", []string{"web"}}, // one substitution beats two edits
		{"web3", []string{"web", "web2"}},
		{"wokrer", []string{"worker"}},
		{"x", nil}, // one letter: anything is one edit away
		{"database", nil},
		{"wbe2", []string{"web2"}},
		{"wb", []string{"db", "web"}}, // ties: both
	} {
		if got := nearNames(c.name, known); !cmp.Equal(got, c.want) {
			t.Errorf("nearNames(%q) = %q, want %q", c.name, got, c.want)
		}
	}
}
