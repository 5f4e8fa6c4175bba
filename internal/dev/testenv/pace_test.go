package testenv

import (
	"strings"
	"testing"
	"time"
)

// TestGuestWait: a wait's bound is its quiet-host base times the host's
// slowness (never less than the base), and a timeout message says what was
// awaited, how the bound was sized and how long earlier waits of the kind
// took.
func TestGuestWait(t *testing.T) {
	kind := "pace-test " + t.Name()
	for _, d := range []time.Duration{300 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond} {
		w := StartGuestWait(kind, time.Minute)
		w.start = w.start.Add(-d)
		w.Done()
	}
	w := StartGuestWait(kind, 50*time.Millisecond)
	if w.Bound() < w.Base || w.Bound() > maxSlowness*w.Base {
		t.Fatalf("bound %s outside [%s, %d x %s]", w.Bound(), w.Base, maxSlowness, w.Base)
	}
	for !w.Expired() {
		time.Sleep(10 * time.Millisecond)
	}
	msg := w.Explain()
	t.Log(msg)
	for _, want := range []string{"for " + kind, "on a quiet host x slowness", "3 earlier waits of this kind took 100ms / 200ms / 300ms"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Explain() = %q, want it to contain %q", msg, want)
		}
	}
	if s := Slowness(); s < 1 || s > maxSlowness {
		t.Errorf("Slowness() = %v, want within [1, %d]", s, maxSlowness)
	}
}
