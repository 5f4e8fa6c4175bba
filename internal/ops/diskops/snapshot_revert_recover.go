package diskops

import (
	"time"

	"context"
	"errors"
	"fmt"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qmp"
)

// A revert whose command died is finished: the VM goes to the snapshot,
// and runs if it was meant to. Whether a QEMU runs is systemd's to say: a
// QEMU started by the revert may not have made its monitor yet.

// revertAction is what recovery does with a revert whose command died.
type revertAction uint8

const (
	revertFinish    revertAction = iota + 1 // the VM is off: finished (and started, if meant to)
	revertUntouched                         // the VM runs, never stopped: the new overlays go, nothing changed
	revertRaced                             // the VM runs again, not on the reverted disks: the revert is dropped
	revertFinishUp                          // the revert's own start runs the guest: finished without a start
	revertResume                            // its QEMU read the memory state but waits paused: resumed, finished
	revertRestart                           // its QEMU never read the memory state: killed, finished with a start from it
)

// note is what recovery says it did (the CLI shows it).
func (a revertAction) note(tag string) string {
	switch a {
	case revertUntouched:
		return "the VM had not been stopped: nothing was changed"
	case revertRaced:
		// Started by another command between the revert's stop and its
		// record: it runs on the disks as they were.
		return fmt.Sprintf("the VM was started again by something else before the revert to %q was recorded: the revert was dropped (revert again)", tag)
	}
	return fmt.Sprintf("reverted to %q", tag)
}

// revertSeen is what recovery sees of a revert whose command died.
type revertSeen struct {
	unitUp   bool // systemd runs the VM's unit
	stopped  bool // journaled: the revert stopped the VM
	reverted bool // the tree records the revert
	memory   bool // it resumes the guest from a memory state
	// run (a unit up): the QEMU's run state, "" when it does not answer.
	run qmp.RunState
}

// decideRevert is what recovery does with a revert whose command died.
func decideRevert(s revertSeen) revertAction {
	switch {
	case !s.unitUp:
		return revertFinish
	case !s.stopped:
		return revertUntouched
	case !s.reverted:
		return revertRaced
	case !s.memory && s.run == qmp.RunPrelaunch:
		// Paused at -S: the start died before it passed the disks and
		// let the guest run.
		return revertRestart
	case !s.memory:
		return revertFinishUp
	}
	switch s.run {
	case qmp.RunRunning:
		return revertFinishUp
	case qmp.RunPaused, qmp.RunPostMigrate:
		return revertResume
	}
	// inmigrate, prelaunch (its disks may not be plugged yet), or no
	// answer: the guest never ran in this QEMU.
	return revertRestart
}

// seeRevert looks at the VM of revert in: its unit (u), and, while it is
// up, the tree and the run state of a QEMU started with memory.
func (s *Service) seeRevert(ctx context.Context, u unitStates, name string, in revertIntent, has func(operation.Step) bool) (revertSeen, error) {
	seen := revertSeen{stopped: has(stepRevertStopped), memory: in.Memory != ""}
	st, err := u.UnitStatus(ctx, name)
	if err != nil {
		return seen, err
	}
	if seen.unitUp = st.Exists && !st.Gone(); !seen.unitUp {
		return seen, nil
	}
	tree, err := snapshottree.Load(s.paths(name).Snapshots())
	if err != nil {
		return seen, err
	}
	seen.reverted = reverted(tree, &in)
	// A QEMU the killed command had just started may not answer yet: wait
	// for it (bounded), or a start that died at -S would be taken for one
	// that ran the guest.
	wait := time.Duration(float64(30*time.Second) * qmp.LoadFactor())
	for deadline := time.Now().Add(wait); ; time.Sleep(50 * time.Millisecond) {
		seen.run = u.RunState(ctx, s.paths(name).QMP)
		if seen.run != "" || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		if st, err := u.UnitStatus(ctx, name); err != nil || st.Gone() {
			break
		}
	}
	return seen, nil
}

// recoverRevert finishes a revert whose command died (decideRevert).
func (s *Service) recoverRevert(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[revertIntent](op)
	if err != nil {
		return "", err
	}
	if op.Has(stepRevertStopping) && !op.Has(stepRevertStopped) {
		// Its stop had begun (QEMU may still be quitting): it is finished,
		// and so is the revert.
		if err := s.env.StopHeld(ctx, name); err != nil {
			return "", fmt.Errorf("stop: %w", err)
		}
		op.Step(stepRevertStopped)
	}
	seen, err := s.seeRevert(ctx, envUnits{s.env}, name, in, op.Has)
	if err != nil {
		return "", err
	}
	switch a := decideRevert(seen); a {
	case revertUntouched, revertRaced:
		removeLayerFiles(in.Layers) // not in the tree: no QEMU uses them
		return a.note(in.Tag), nil
	case revertFinishUp:
		in.Start = false // started before the kill
	case revertResume:
		if err := s.resume(ctx, name); err != nil {
			return "", err
		}
		in.Start = false
	case revertRestart:
		if err := s.env.KillUnit(ctx, name); err != nil {
			return "", err
		}
		in.Start = true
	}
	var res RevertResult
	if err := s.finishRevert(ctx, name, op, &in, &res); err != nil {
		var gu *revertGaveUp
		if errors.As(err, &gu) {
			// Given up, never tried again: the journal ends, and the
			// command that settled it goes on with the VM off.
			return gu.Error(), nil
		}
		return "", err
	}
	return revertFinish.note(in.Tag), nil
}

// resume resumes the VM's guest.
func (s *Service) resume(ctx context.Context, name string) error {
	c, release, err := s.env.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	return c.Cont(ctx)
}

// reverted reports whether the tree already records the revert.
func reverted(tree *snapshottree.Tree, in *revertIntent) bool {
	if tree.Current != in.Tag {
		return false
	}
	for _, l := range in.Layers {
		if tree.Active[l.Disk].Path != l.Overlay.Path {
			return false
		}
	}
	return true
}
