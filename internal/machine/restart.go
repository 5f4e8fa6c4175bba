package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// opRestart is a restart's operation in the journal (down, then up).
const opRestart operation.Kind = "restart"

// Restarted is Restart's UpAction: a running VM went down and up again with
// the changed spec.
const Restarted UpAction = "restarted"

// RestartOptions tune RestartWith.
type RestartOptions struct {
	// Waiting, when set, is told what the health gate waits for while it
	// waits (each time it looks).
	Waiting GateWaiting
}

// GateWaiting is told how long a restart's health gate waited, its bound
// and what for.
type GateWaiting func(waited, timeout time.Duration, what string)

// Restart is RestartWith without options.
func (s *Env) Restart(ctx context.Context, f *spec.File) (UpResult, error) {
	return s.RestartWith(ctx, f, RestartOptions{})
}

// RestartWith applies a changed file to a running VM the only way QEMU allows
// for most settings: a graceful down, then up with the new spec, gated by
// the VM's [health] (healthGate). A VM that is not running is simply
// brought up. If the new spec fails to start or to pass the gate, the spec
// that ran before is started again, so a bad edit never leaves the VM down;
// the error says so.
func (s *Env) RestartWith(ctx context.Context, f *spec.File, o RestartOptions) (UpResult, error) {
	name := f.VM.Name
	if err := s.ValidateContext(ctx, f); err != nil {
		return UpResult{VM: name}, err
	}
	if err := s.CheckOwner(f, false); err != nil {
		return UpResult{VM: name}, err
	}
	off, err := s.shutOff(ctx, name)
	if errors.Is(err, ErrNotFound) || err == nil && off {
		res, err := s.Up(ctx, f)
		return first(res, name), err
	}
	if err != nil {
		return UpResult{VM: name}, err
	}
	old, err := s.AppliedFile(name)
	if err != nil {
		return UpResult{VM: name}, vmerr.Wrap(name, fmt.Errorf("restart: the spec it runs with: %w", err))
	}
	agentBefore := f.VM.HasGuestAgent() && s.agentAnswers(ctx, name)
	// Down and up under one lock, journaled: a restart killed between them
	// is finished by the next command (recoverRestart).
	lu, err := s.LockUnit(ctx, name, "restart")
	if err != nil {
		return UpResult{VM: name}, err
	}
	defer lu.unlock()
	op, err := s.ops.Begin(ctx, name, opRestart, restartIntent{File: absPath(f.Path), Raw: f.Raw})
	if err != nil {
		return UpResult{VM: name}, vmerr.Wrap(name, err)
	}
	defer op.End()
	if _, err := s.DownLocked(ctx, name, lu, DownOptions{}); err != nil {
		return UpResult{VM: name}, vmerr.In(name, "restart", err)
	}
	op.Step(restartDown)
	return s.startGated(ctx, lu.sd, f, old, op, agentBefore, o.Waiting)
}

// startGated starts f's VM (down, under its lock, journaled by op) and
// holds it to its health gate; on failure old comes back. The journal's
// intent becomes old before the rollback, so that a rollback cut off is
// finished with old, never with the spec that failed.
func (s *Env) startGated(ctx context.Context, sd *units.Manager, f, old *spec.File, op *operation.Op, agentBefore bool, waiting GateWaiting) (UpResult, error) {
	name := f.VM.Name
	r, err := s.startLocked(ctx, f, op)
	if err == nil {
		if err = s.healthGate(ctx, sd, name, f.VM.Health, r.Accel, agentBefore, waiting); err == nil {
			r.Action = Restarted
			return r, nil
		}
	}
	bg := context.WithoutCancel(ctx)
	if ierr := op.SetIntent(restartIntent{File: absPath(old.Path), Raw: old.Raw}); ierr != nil {
		return UpResult{VM: name}, fmt.Errorf("%w; the rollback could not be journaled: %v", err, ierr)
	}
	unit := s.state.UnitOf(name)
	if st, serr := sd.Status(bg, unit); serr == nil && !st.Gone() {
		if _, derr := s.DownLocked(bg, name, &LockedUnit{sd: sd, unit: unit, st: st}, DownOptions{}); derr != nil {
			return UpResult{VM: name}, fmt.Errorf("%w; taking the new QEMU down failed too: %s", err, vmerr.Unnamed(name, derr))
		}
	}
	op.Step(restartRollback)
	if _, rerr := s.startLocked(bg, old, nil); rerr != nil {
		return UpResult{VM: name}, fmt.Errorf("%w; starting the previous spec again failed too: %s (the VM is down)", err, vmerr.Unnamed(name, rerr))
	}
	return UpResult{VM: name, Action: Unchanged}, fmt.Errorf("%w; the VM runs again with its previous spec", err)
}

// restartRollback is the step after which a failed restart's new QEMU is
// gone and the previous spec starts.
const restartRollback = "rollback"

// restartDown is the step of a restart after which the VM is down.
const restartDown operation.Step = "down"

// startLocked starts f's VM through the start pipeline when the caller
// holds its lock; op, if set, journals its steps.
func (s *Env) startLocked(ctx context.Context, f *spec.File, op *operation.Op) (UpResult, error) {
	return s.StartRestored(ctx, f, op, "")
}

// StartRestored is startLocked resuming the guest from a memory state
// file (state "" boots it).
func (s *Env) StartRestored(ctx context.Context, f *spec.File, op *operation.Op, state string) (UpResult, error) {
	r := s.newStart(f, StartFresh, IncomingArgs{})
	r.locked, r.restore = true, state
	after := s.opts.AfterStep
	if op != nil {
		after = op.After()
	}
	if _, err := steps.Run(ctx, r.name, r.steps(), after); err != nil {
		return r.res, err
	}
	if r.res.Action == "" {
		r.res.Action, r.res.State = Started, vmstore.StateRunning
		s.Lifecycle(r.name, eventlog.Started, map[string]any{"generation": r.app.Generation, "accel": r.app.Accel})
	}
	return r.res, nil
}

func first(res []UpResult, name string) UpResult {
	if len(res) == 0 {
		return UpResult{VM: name}
	}
	return res[0]
}

// AppliedFile parses the spec the VM last started with (its record), with
// relative paths resolved against the file it came from.
func (s *Env) AppliedFile(name string) (*spec.File, error) {
	p := s.Paths(name)
	raw, err := os.ReadFile(p.Spec)
	if err != nil {
		return nil, err
	}
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return nil, err
	}
	return spec.Parse(orDefault(app.SourceFile, p.Spec), raw)
}

// AppliedSpec is the spec the VM was last started with (as vmsup recorded
// it, not the file as it is now).
func (s *Env) AppliedSpec(name string) (*spec.File, error) {
	if err := spec.ValidName(name); err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	f, err := s.AppliedFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, s.NotFound(name)
	}
	return f, vmerr.Wrap(name, err)
}

// shutOff says whether the VM is shut off as status would say (its unit
// stopped, not failed), after settling what a killed command left; a name
// with no state directory is ErrNotFound.
func (s *Env) shutOff(ctx context.Context, name string) (bool, error) {
	_, _ = s.ops.SettleIfFree(ctx, name) // as status: its failure is the next command's
	sd, err := s.Systemd(ctx)
	if err != nil {
		return false, err
	}
	st, err := sd.Status(ctx, s.state.UnitOf(name))
	if err != nil || !st.Stopped() {
		return false, err
	}
	if _, err := os.Stat(s.Paths(name).Dir); errors.Is(err, os.ErrNotExist) {
		return false, s.NotFound(name)
	}
	return true, nil
}
