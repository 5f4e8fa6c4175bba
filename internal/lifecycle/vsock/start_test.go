package vsock

import (
	"errors"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/spec"
)

// TestStartSteps: a VM with vsock has the vsock step and cannot migrate
// on one host; one without has neither.
func TestStartSteps(t *testing.T) {
	s := Start{ForRoot(t.TempDir())}
	f := &spec.File{VM: spec.VM{Name: "web"}}
	var plan startplan.Plan
	if s.Steps(f, &plan) != nil || s.Reuse(f, &plan) != nil {
		t.Error("no vsock: a step or a refusal")
	}
	f.VM.Vsock = spec.Vsock{Enabled: true}
	if st := s.Steps(f, &plan); len(st) != 1 || st[0].Name != Step || st[0].Undo != nil {
		t.Errorf("steps %+v", st)
	}
	if err := s.Reuse(f, &plan); !errors.Is(err, ErrLocalMigration) {
		t.Errorf("reuse: %v", err)
	}
}
