package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Recovery of the operations the supervisor still runs itself (resize,
// restart; journal.go), and the helpers recoveries share. The hot-plugs'
// recovery is internal/hotplug's.

func rulePaths(rules []units.PathRule) []string {
	paths := make([]string, len(rules))
	for i, r := range rules {
		paths[i] = r.Path
	}
	return paths
}

// liveQMP is the running VM's monitor, or nil (no error) when QEMU is gone.
func (s *Supervisor) liveQMP(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	if _, err := os.Stat(s.paths(name).QMP); err != nil {
		return nil, func() {}, nil
	}
	return s.qmpSession(ctx, name)
}

func (s *Supervisor) recoverResize(ctx context.Context, name string, _ *operation.Op) (string, error) {
	v, err := s.view(name)
	if errors.Is(err, ErrNotRunning) {
		return "QEMU is gone: nothing to reconcile", nil
	}
	if err != nil {
		return "", err
	}
	app, vm := v.Applied, v.Booted
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	cpus, mem, err := s.recordResize(ctx, c, app, vm)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("recorded what QEMU has: %d vCPUs, %s", cpus, mem), nil
}

// restartIntent is a restart's: the file it applies.
type restartIntent struct {
	File string `json:"file"`
	Raw  []byte `json:"raw"`
}

// recoverRestart finishes a restart whose command died: the VM is taken
// down if that had not been done (a graceful stop may have been under way:
// it is finished, not left to power the guest off later), then started (with
// the new file if it still parses, else with the spec it ran with), unless
// the recovering command takes it down anyway. A restart that got as far as
// starting QEMU is done.
func (s *Supervisor) recoverRestart(ctx context.Context, name string, op *operation.Op) (string, error) {
	by := op.SettledBy()
	sd, err := s.systemd(ctx)
	if err != nil {
		return "", err
	}
	unit := s.state.UnitOf(name)
	st, err := sd.Status(ctx, unit)
	if err != nil {
		return "", err
	}
	switch {
	case op.Has(StepUnit) && !st.Gone():
		return "the VM runs", nil
	case by == "down" || by == "rm":
		return "left for " + by, nil
	}
	if !op.Has(restartDown) && !st.Gone() {
		if _, err := s.down(ctx, name, &lockedUnit{sd: sd, unit: unit, st: st}, DownOptions{}); err != nil {
			return "", err
		}
	}
	f, err := s.appliedFile(name)
	if in, ierr := intentOf[restartIntent](op); ierr == nil {
		if nf, perr := spec.Parse(in.File, in.Raw); perr == nil && nf.VM.Name == name {
			f, err = nf, nil
		}
	}
	if err != nil {
		return "", err
	}
	if _, err := s.startLocked(ctx, f, nil); err != nil {
		return "", err
	}
	return "the restart is finished: started from " + f.Path, nil
}
