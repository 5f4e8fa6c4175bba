package machine

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/spec"
)

// Recovery of a restart (the reboot's is beside it in power.go); the
// feature packages register their own (journal.go).

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
func (s *Env) recoverRestart(ctx context.Context, name string, op *operation.Op) (string, error) {
	by := op.SettledBy()
	sd, err := s.Systemd(ctx)
	if err != nil {
		return "", err
	}
	unit := s.state.UnitOf(name)
	st, err := sd.Status(ctx, unit)
	if err != nil {
		return "", err
	}
	// Its new QEMU's unit is up: the start below leaves a QEMU that runs
	// the guest as it is, and stops and starts again one the killed start
	// left paused at -S without its disks.
	started := op.Has(StepUnit) && !st.Gone()
	if !started && (by == "down" || by == "rm") {
		return "left for " + by, nil
	}
	if !started && !op.Has(restartDown) && !st.Gone() {
		if _, err := s.DownLocked(ctx, name, &LockedUnit{sd: sd, unit: unit, st: st}, DownOptions{}); err != nil {
			return "", err
		}
	}
	f, err := s.AppliedFile(name)
	if in, ierr := operation.IntentOf[restartIntent](op); ierr == nil {
		if nf, perr := spec.Parse(in.File, in.Raw); perr == nil && nf.VM.Name == name {
			f, err = nf, nil
		}
	}
	if err != nil {
		return "", err
	}
	r, err := s.startLocked(ctx, f, nil)
	if err != nil {
		return "", err
	}
	if started && r.Action != Started {
		return "the VM runs", nil
	}
	return "the restart is finished: started from " + f.Path, nil
}
