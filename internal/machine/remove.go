package machine

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// Remove forgets a VM that is not running ("virsh undefine"): its state
// directory, vmsup's records, leftovers of its host set-up and its autostart
// mark. Disk images are the user's and stay. A running VM is refused.
func (s *Env) Remove(ctx context.Context, name string) error {
	if err := spec.ValidName(name); err != nil {
		return vmerr.Wrap(name, err)
	}
	return s.remove(ctx, name)
}

func (s *Env) remove(ctx context.Context, name string) error {
	lu, err := s.LockUnit(ctx, name, "rm")
	if err != nil {
		return err
	}
	defer lu.unlock()
	sd, unit, st := lu.sd, lu.unit, lu.st
	switch {
	case st.ActiveState == "failed":
		if err := sd.ResetFailed(ctx, unit); err != nil {
			return vmerr.Wrap(name, err)
		}
	case st.Exists && st.ActiveState != "inactive":
		return vmerr.Wrap(name, fmt.Errorf("it is %s (unit %s); vmsup down it first", st.ActiveState, unit))
	}
	p := s.Paths(name)
	known := s.AutostartMarks().IsEnabled(name)
	for _, d := range []string{p.Dir, p.Records} {
		if _, err := os.Stat(d); err == nil {
			known = true
		}
	}
	if !known {
		return s.NotFound(name)
	}
	return s.forget(ctx, name)
}

// ForgetMoved forgets a shut-off VM that now lives on another host (vmsup
// move): as Remove, under the lock its caller holds, its unit's failed
// state reset; the records, which hold the caller's journal, go last.
func (s *Env) ForgetMoved(ctx context.Context, name string) error {
	sd, err := s.Systemd(ctx)
	if err != nil {
		return err
	}
	unit := s.state.UnitOf(name)
	if st, err := sd.Status(ctx, unit); err == nil && st.ActiveState == "failed" {
		if err := sd.ResetFailed(ctx, unit); err != nil {
			return vmerr.Wrap(name, err)
		}
	}
	return s.forget(ctx, name)
}

func (s *Env) forget(ctx context.Context, name string) error {
	p := s.Paths(name)
	// What a crash may have left: taps, grants, secrets.
	if err := s.AfterStop(ctx, name); err != nil {
		return err
	}
	if s.AutostartMarks().IsEnabled(name) {
		if err := s.Disable(ctx, name); err != nil {
			return err
		}
	}
	// Its vsock CID was kept from start to start: free for others now.
	if err := s.vsocks().Release(ctx, name); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("vsock: %w", err))
	}
	if err := errors.Join(s.state.RemoveVMFile(name), p.RemoveAll()); err != nil {
		return vmerr.Wrap(name, err)
	}
	return nil
}
