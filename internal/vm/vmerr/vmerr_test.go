package vmerr

import (
	"errors"
	"testing"
)

// TestWrap: the VM is named once, however often an error is wrapped, and
// the cause stays reachable; In names an operation without naming the VM
// twice.
func TestWrap(t *testing.T) {
	base := errors.New("boom")
	e := Wrap("web", Wrap("web", base))
	if e.Error() != `vm "web": boom` || !errors.Is(e, base) {
		t.Errorf("wrapped twice: %v", e)
	}
	if Wrap("web", nil) != nil {
		t.Error("nil wrapped")
	}
	if got := Wrap("db", e).Error(); got != `vm "db": vm "web": boom` {
		t.Errorf("another VM's error: %q", got)
	}
	if got := In("web", "restart", e).Error(); got != `vm "web": restart: boom` || !errors.Is(In("web", "restart", e), base) {
		t.Errorf("In: %q", got)
	}
}
