package supervisor

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/vmstate"
)

// TestApplyBusy: a second apply of a VM while one runs fails as busy,
// naming the first (exit code 4 in the CLI), and goes once it is done.
func TestApplyBusy(t *testing.T) {
	s, err := New(Options{Root: t.TempDir(), Self: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	unlock, err := s.applyLock(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.applyLock(ctx, "web")
	var busy *vmstate.BusyError
	if !errors.As(err, &busy) || busy.PID != os.Getpid() || !strings.Contains(err.Error(), `vm "web": busy: apply by pid`) {
		t.Fatalf("second apply: %v", err)
	}
	if _, err := s.applyLock(ctx, "db"); err != nil {
		t.Errorf("another VM's apply: %v", err)
	}
	unlock()
	again, err := s.applyLock(ctx, "web")
	if err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	again()
}
