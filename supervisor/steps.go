package supervisor

import (
	"context"
	"errors"
	"fmt"
)

// step is one named part of a start (or other multi-part) sequence, with the
// undo that reverts it when a later step fails.
type step struct {
	name string
	do   func(ctx context.Context) error
	undo func(ctx context.Context) // nil when there is nothing to revert
}

// errStopHere, returned by a step, ends the sequence successfully after it:
// nothing later runs and nothing is undone (up of a VM that already exists).
var errStopHere = errors.New("stop here")

// runSteps runs steps in order. When one fails, the ones before it are undone
// in reverse order and the error names the failing step. afterStep, when set,
// is called after each successful step (fault injection, tracing).
func runSteps(ctx context.Context, vm string, steps []step, afterStep func(vm, step string)) error {
	for i, s := range steps {
		err := s.do(ctx)
		if errors.Is(err, errStopHere) {
			if afterStep != nil {
				afterStep(vm, s.name)
			}
			return nil
		}
		if err != nil {
			// Undo with a fresh context: the caller's may be what failed.
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
			for j := i - 1; j >= 0; j-- {
				if steps[j].undo != nil {
					steps[j].undo(uctx)
				}
			}
			cancel()
			return &StepError{VM: vm, Step: s.name, Err: err}
		}
		if afterStep != nil {
			afterStep(vm, s.name)
		}
	}
	return nil
}

// StepError is a failed step of a multi-step operation on one VM.
type StepError struct {
	VM   string
	Step string
	Err  error
}

func (e *StepError) Error() string { return fmt.Sprintf("vm %q: %s: %v", e.VM, e.Step, e.Err) }
func (e *StepError) Unwrap() error { return e.Err }
