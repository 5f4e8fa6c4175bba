package diskops

import "testing"

// TestDecideClone: a clone that runs is kept; anything less is taken back.
func TestDecideClone(t *testing.T) {
	if decideClone(true) != cloneKeep || decideClone(false) != cloneUndo {
		t.Error("a running clone is not kept, or a clone not running is")
	}
	for a, want := range map[cloneAction]string{
		cloneKeep: "clone web-2 runs: kept it",
		cloneUndo: "clone web-2 had not started: removed what was made of it",
	} {
		if got := a.note("web-2"); got != want {
			t.Errorf("%d: %q, want %q", a, got, want)
		}
	}
}
