package supervisor

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// TestApplyBusy: while an apply holds a VM's lock (across its plan and
// every change), another command on the VM fails as busy, naming the apply
// (exit code 4 in the CLI), and goes once it is done; the apply's own
// operations run under its lock.
func TestApplyBusy(t *testing.T) {
	s, err := New(Options{Root: t.TempDir(), Self: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	lk, err := s.env.Lock(ctx, "web", "apply")
	if err != nil {
		t.Fatal(err)
	}
	in := operation.Holding(ctx, "web")
	inner, err := s.env.Lock(in, "web", "disk-attach")
	if err != nil {
		t.Fatalf("an operation of the apply itself: %v", err)
	}
	inner.Unlock() // borrowed: the apply's lock stays
	for _, op := range []string{"apply", "disk-move"} {
		_, err = s.env.Lock(ctx, "web", op)
		var busy *vmstore.BusyError
		if !errors.As(err, &busy) || busy.PID != os.Getpid() || !strings.Contains(err.Error(), `vm "web": busy: apply by pid`) {
			t.Fatalf("%s during an apply: %v", op, err)
		}
	}
	if l, err := s.env.Lock(in, "db", "apply"); err != nil {
		t.Errorf("another VM's apply: %v", err)
	} else {
		l.Unlock()
	}
	lk.Unlock()
	again, err := s.env.Lock(ctx, "web", "apply")
	if err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	again.Unlock()
}
