package steps

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestRun: a failing step undoes the ones before it in reverse and is
// named; ErrStopHere ends early with nothing undone; the undo of a run that
// succeeded takes everything back.
func TestRun(t *testing.T) {
	var log []string
	mk := func(name string, fail error) Step {
		return Step{Name: name, Do: func(context.Context) error { log = append(log, "do "+name); return fail },
			Undo: func(context.Context) { log = append(log, "undo "+name) }}
	}
	var traced []string
	after := func(_, s string) { traced = append(traced, s) }
	_, err := Run(context.Background(), "x", []Step{mk("a", nil), mk("b", nil), mk("c", errors.New("boom"))}, after)
	var se *Error
	if !errors.As(err, &se) || se.Step != "c" || err.Error() != `vm "x": c: boom` {
		t.Fatalf("err %v", err)
	}
	if got := strings.Join(log, ","); got != "do a,do b,do c,undo b,undo a" {
		t.Fatalf("order %s", got)
	}
	if strings.Join(traced, ",") != "a,b" {
		t.Fatalf("traced %v", traced)
	}
	log = nil
	undo, err := Run(context.Background(), "x", []Step{mk("a", nil), mk("b", ErrStopHere), mk("c", nil)}, nil)
	if err != nil || strings.Join(log, ",") != "do a,do b" {
		t.Fatalf("stop here: %v %v", err, log)
	}
	undo(context.Background())
	if strings.Join(log, ",") != "do a,do b" {
		t.Fatalf("stop here undid: %v", log)
	}
	log = nil
	undo, err = Run(context.Background(), "x", []Step{mk("a", nil), mk("b", nil)}, nil)
	undo(context.Background())
	if err != nil || strings.Join(log, ",") != "do a,do b,undo b,undo a" {
		t.Fatalf("undo all: %v %v", err, log)
	}
	if Cause(se) == nil || Cause(se).Error() != "boom" {
		t.Fatalf("cause %v", Cause(se))
	}
}
