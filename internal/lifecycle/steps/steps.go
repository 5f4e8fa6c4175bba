// Package steps runs a multi-step operation on one VM as a list of named
// steps, each with its undo: a failed step undoes the ones before it, in
// reverse, and the error names the step. The start pipeline, hotplug and
// the migration destination are all such lists, so they can be listed,
// traced and killed between any two steps (AfterStep).
package steps

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Step is one named part of a sequence, with the undo that reverts it when
// a later step fails.
type Step struct {
	Name string
	Do   func(ctx context.Context) error
	Undo func(ctx context.Context) // nil when there is nothing to revert
}

// ErrStopHere, returned by a step, ends the sequence successfully after it:
// nothing later runs and nothing is undone (up of a VM that already exists).
var ErrStopHere = errors.New("stop here")

// UndoTimeout bounds the undo of a failed sequence.
const UndoTimeout = 20 * time.Second

// Run runs steps in order. When one fails, the ones before it are undone in
// reverse order and the error (*Error) names the failing step. after, when
// set, is called after each successful step (fault injection, tracing). On
// success it returns the undo of every step that ran, for a caller that may
// still have to take it all back (a migration destination the source
// aborts).
func Run(ctx context.Context, vm string, steps []Step, after func(vm, step string)) (undoAll func(context.Context), err error) {
	var done []Step
	undo := func(ctx context.Context) {
		// Undo with a fresh context: the caller's may be what failed.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), UndoTimeout)
		defer cancel()
		for j := len(done) - 1; j >= 0; j-- {
			if done[j].Undo != nil {
				done[j].Undo(uctx)
			}
		}
	}
	for _, s := range steps {
		err := s.Do(ctx)
		if errors.Is(err, ErrStopHere) {
			if after != nil {
				after(vm, s.Name)
			}
			return func(context.Context) {}, nil
		}
		if err != nil {
			undo(ctx)
			return nil, &Error{VM: vm, Step: s.Name, Err: err}
		}
		done = append(done, s)
		if after != nil {
			after(vm, s.Name)
		}
	}
	return undo, nil
}

// Names lists the steps' names, in order.
func Names(steps []Step) []string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return names
}

// Error is a failed step of a multi-step operation on one VM.
type Error struct {
	VM   string
	Step string
	Err  error
}

func (e *Error) Error() string  { return fmt.Sprintf("vm %q: %s: %v", e.VM, e.Step, e.Err) }
func (e *Error) Unwrap() error  { return e.Err }
func (e *Error) VMName() string { return e.VM } // which VM the error is about

// Cause is what failed inside a step, for callers whose errors name the
// operation themselves.
func Cause(err error) error {
	var se *Error
	if errors.As(err, &se) {
		return se.Err
	}
	return err
}
