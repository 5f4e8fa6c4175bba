package supervisor

import (
	"context"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/spec"
)

// Remove forgets a VM that is not running ("virsh undefine"): its state
// directory, vmsup's records, leftovers of its host set-up and its autostart
// mark. Disk images are the user's and stay. A running VM is refused.
func (s *Supervisor) Remove(ctx context.Context, name string) error {
	if err := spec.ValidName(name); err != nil {
		return vmErr(name, err)
	}
	lu, err := s.lockUnit(ctx, name, "rm")
	if err != nil {
		return err
	}
	defer lu.unlock()
	sd, unit, st := lu.sd, lu.unit, lu.st
	switch {
	case st.ActiveState == "failed":
		if err := sd.ResetFailed(ctx, unit); err != nil {
			return vmErr(name, err)
		}
	case st.Exists && st.ActiveState != "inactive":
		return vmErr(name, fmt.Errorf("it is %s (unit %s); vmsup down it first", st.ActiveState, unit))
	}
	p := s.paths(name)
	known := s.isEnabled(name)
	for _, d := range []string{p.Dir, p.Records} {
		if _, err := os.Stat(d); err == nil {
			known = true
		}
	}
	if !known {
		return vmErr(name, ErrNotFound)
	}
	// What a crash may have left: taps, grants, secrets.
	if err := s.afterStop(ctx, name); err != nil {
		return err
	}
	if s.isEnabled(name) {
		if err := s.Disable(ctx, name); err != nil {
			return err
		}
	}
	if err := p.RemoveAll(); err != nil {
		return vmErr(name, err)
	}
	// Its vsock CID was kept from start to start: free for others now.
	if err := s.vsocks().Release(ctx, name); err != nil {
		return vmErr(name, fmt.Errorf("vsock: %w", err))
	}
	return nil
}
