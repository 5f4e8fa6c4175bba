package machine

import (
	"context"
	"os"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// The starts and stops a disk operation makes (internal/ops/diskops): a
// clone's start from its template's memory, a revert's stop under the lock
// its command holds and its start from a memory state, and the kill that
// takes a half-started VM back.

// StartReport is what a start reports.
type StartReport struct {
	Accel       spec.Accel
	AccelReason string
	Note        string
}

// StartClone starts the clone f through the start pipeline, resuming the
// template's memory state, under the clone's own lock (taken by the
// start's lock step and let go after); after sees each step, and the
// lifecycle event names from ("VM:TAG").
func (s *Env) StartClone(ctx context.Context, f *spec.File, memory, from string, after func(vm, step string)) (StartReport, error) {
	r := s.newStart(f, StartFresh, IncomingArgs{})
	r.restore = memory
	_, err := steps.Run(ctx, r.name, r.steps(), after)
	if r.lk != nil {
		r.lk.Unlock() // the clone's own lock, taken by the start's lock step
	}
	if err != nil {
		return StartReport{}, err
	}
	s.Lifecycle(r.name, eventlog.Started, map[string]any{"generation": r.app.Generation, "cloned_from": from})
	return StartReport{Accel: r.res.Accel, AccelReason: r.res.AccelReason, Note: r.res.Note}, nil
}

// StopHeld stops the VM at once, under the lock the calling command holds
// (borrowed here).
func (s *Env) StopHeld(ctx context.Context, name string) error {
	lu, err := s.LockUnit(operation.Holding(ctx, name), name, "down")
	if err != nil {
		return err
	}
	defer lu.unlock()
	_, err = s.DownLocked(ctx, name, lu, DownOptions{Force: true})
	return err
}

// KillUnit kills the VM's unit, marked as vmsup's kill for its stop-post
// hook, and clears its failed state.
func (s *Env) KillUnit(ctx context.Context, name string) error {
	sd, err := s.Systemd(ctx)
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.Paths(name).KillMark(), nil, 0o600); err != nil {
		return err
	}
	s.RemoveUnit(ctx, sd, s.state.UnitOf(name))
	return nil
}

// Running says whether the VM's guest runs now (QEMU answers "running").
func (s *Env) Running(ctx context.Context, name string) bool {
	c, release, err := s.QMPSession(ctx, name)
	if err != nil {
		return false
	}
	defer release()
	qs, err := c.QueryStatus(ctx)
	return err == nil && qs.Status == qmp.RunRunning
}

// PinnedMachine is the machine type a start of f runs now: the VM's pinned
// one, which a memory state must match.
func (s *Env) PinnedMachine(f *spec.File) (string, error) {
	return s.PinMachine(f, f.VM.Machine, s.RecordedMachine(f.VM.Name))
}
