package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/spec"
)

// Restarted is Restart's UpAction: a running VM went down and up again with
// the changed spec.
const Restarted UpAction = "restarted"

// Restart applies a changed file to a running VM the only way QEMU allows
// for most settings: a graceful down, then up with the new spec. A VM that
// is not running is simply brought up. If the new spec fails to start, the
// spec that ran before is started again, so a bad edit never leaves the VM
// down; the error says so.
func (s *Supervisor) Restart(ctx context.Context, f *spec.File) (UpResult, error) {
	name := f.VM.Name
	if err := s.ValidateContext(ctx, f); err != nil {
		return UpResult{VM: name}, err
	}
	st, err := s.status(ctx, name, false)
	if errors.Is(err, ErrNotFound) || err == nil && st.State == StateShutOff {
		res, err := s.Up(ctx, f)
		return first(res, name), err
	}
	if err != nil {
		return UpResult{VM: name}, err
	}
	old, err := s.appliedFile(name)
	if err != nil {
		return UpResult{VM: name}, vmErr(name, fmt.Errorf("restart: the spec it runs with: %w", err))
	}
	if _, err := s.Down(ctx, name); err != nil {
		return UpResult{VM: name}, vmErrIn(name, "restart", err)
	}
	res, err := s.Up(ctx, f)
	if err == nil {
		r := first(res, name)
		r.Action = Restarted
		return r, nil
	}
	if _, rerr := s.Up(context.WithoutCancel(ctx), old); rerr != nil {
		return UpResult{VM: name}, fmt.Errorf("%w; starting the previous spec again failed too: %s (the VM is down)", err, unnamed(name, rerr))
	}
	return UpResult{VM: name, Action: Unchanged}, fmt.Errorf("%w; the VM runs again with its previous spec", err)
}

func first(res []UpResult, name string) UpResult {
	if len(res) == 0 {
		return UpResult{VM: name}
	}
	return res[0]
}

// appliedFile parses the spec the VM last started with (its record), with
// relative paths resolved against the file it came from.
func (s *Supervisor) appliedFile(name string) (*spec.File, error) {
	p := s.paths(name)
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
