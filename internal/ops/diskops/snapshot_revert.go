package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// A revert puts each disk of a snapshot on a new overlay on the image it
// was frozen in (so the snapshot can be reverted to again), drops the
// writes made since (the overlays no snapshot holds), and, for a snapshot
// with memory, starts the VM from its saved state.

const opSnapshotRevert operation.Kind = "snapshot-revert"

// Steps of a revert in the journal that its recovery reads.
const (
	stepRevertOverlays operation.Step = "overlays" // the new overlays are made
	stepRevertStopping operation.Step = "stopping" // the stop begins: from here recovery finishes the revert
	stepRevertStopped  operation.Step = "stopped"  // the VM is stopped
	stepRevertRecord   operation.Step = "record"   // the tree records the revert
)

// RevertResult reports a revert.
type RevertResult struct {
	VM, Tag string
	// Started: the VM runs after it (it ran before, or the snapshot has
	// memory and the guest resumed where it was).
	Started bool
	// Restored: the guest resumed from the snapshot's memory.
	Restored bool
	Dropped  []string // files of the state since, deleted
	Duration time.Duration
}

type revertIntent struct {
	Tag     string               `json:"tag"`
	Layers  []snapshottree.Layer `json:"layers"`
	Start   bool                 `json:"start"`  // start the VM after
	Memory  string               `json:"memory"` // from this state file
	Dropped []string             `json:"dropped,omitempty"`
	RBD     []spec.Disk          `json:"rbd,omitempty"` // rolled back
}

// RevertSnapshot reverts VM name to snapshot tag. A running VM is stopped
// first (it loses its state since), only with force.
func (s *Service) RevertSnapshot(ctx context.Context, name, tag string, force bool) (RevertResult, error) {
	res := RevertResult{VM: name, Tag: tag}
	start := time.Now()
	fail := func(err error) (RevertResult, error) {
		return res, vmerr.Wrap(name, fmt.Errorf("revert to %q: %w", tag, err))
	}
	lk, err := s.lock(ctx, name, string(opSnapshotRevert))
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	v, err := s.env.View(name)
	running := err == nil
	if err != nil && !errors.Is(err, vmstore.ErrNotRunning) {
		return fail(err)
	}
	if running && !force {
		return fail(errors.New("the VM is running and would lose everything since the snapshot: stop it, or pass --force"))
	}
	app, tree := v.Applied, v.Tree
	disks, err := s.snapshotDisks(v)
	if err != nil {
		return fail(err)
	}
	snap, layers, err := tree.PlanRevert(tag, disks.files, exists)
	if err != nil {
		return fail(err)
	}
	in := revertIntent{Tag: tag, Layers: layers, Start: running, Memory: snap.Memory}
	for name := range snap.RBD {
		i := slices.IndexFunc(disks.rbd, func(d spec.Disk) bool { return d.Name == name })
		if i < 0 {
			return fail(fmt.Errorf("snapshot %q has RBD disk %q, which the VM no longer has", tag, name))
		}
		in.RBD = append(in.RBD, disks.rbd[i])
	}
	if snap.Memory != "" {
		if err := s.checkMemoryRevert(name, snap, app); err != nil {
			return fail(err)
		}
		in.Start = true
	}
	op, err := s.k.Begin(ctx, name, opSnapshotRevert, in)
	if err != nil {
		return fail(err)
	}
	// The overlays first, while the VM still runs: a full filesystem
	// refuses the revert before anything is stopped.
	if err := s.revertOverlays(ctx, &in); err != nil {
		removeLayerFiles(in.Layers)
		op.End()
		return fail(err)
	}
	op.Step(stepRevertOverlays)
	if running {
		// Journaled before the stop: a QEMU told to quit goes on quitting
		// after a kill, so recovery must not take it for never stopped.
		op.Step(stepRevertStopping)
		if err := s.env.StopHeld(ctx, name); err != nil {
			op.End()
			return fail(fmt.Errorf("stop: %w", err))
		}
		op.Step(stepRevertStopped)
	}
	// From here the VM is off: what is left is finished by recovery.
	if err := s.finishRevert(ctx, name, op, &in, &res); err != nil {
		var gu *revertGaveUp
		if errors.As(err, &gu) {
			op.End() // nothing is left for recovery to do
			// Named here: the start's error inside names the VM already.
			return res, &vmerr.Error{VM: name, Err: gu}
		}
		return fail(err)
	}
	op.End()
	res.Duration = time.Since(start)
	s.env.Lifecycle(name, "snapshot-revert", map[string]any{"tag": tag, "restored": res.Restored})
	return res, nil
}

// finishRevert does the revert's work on a VM that is off, each part safe
// to do again: overlays, record, dropped files, start.
func (s *Service) finishRevert(ctx context.Context, name string, op *operation.Op, in *revertIntent, res *RevertResult) error {
	p := s.paths(name)
	tree, err := snapshottree.Load(p.Snapshots())
	if err != nil {
		return err
	}
	if !op.Has(stepRevertRecord) {
		for _, d := range in.RBD { // again after a kill: a rollback is idempotent
			if err := s.env.Tools().RBDSnap(ctx, d, "rollback", snapshottree.RBDSnapName(in.Tag)); err != nil {
				return fmt.Errorf("disk %q: %w", d.Name, err)
			}
		}
		if err := s.revertOverlays(ctx, in); err != nil {
			return err
		}
		in.Dropped = tree.Reverted(in.Tag, in.Layers)
		if err := op.SetIntent(in); err != nil {
			return err
		}
		if err := s.saveTree(name, tree); err != nil {
			return err
		}
		op.Step(stepRevertRecord)
	}
	for _, f := range in.Dropped {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	res.Dropped = in.Dropped
	if !in.Start {
		return nil
	}
	f, err := s.env.AppliedFile(name)
	if err != nil {
		return err
	}
	if _, err := s.env.StartRestored(ctx, f, op, in.Memory); err != nil {
		// Tried again, it would fail again (a state QEMU cannot load): the
		// revert gives up with the VM off on the snapshot's disks.
		return &revertGaveUp{tag: in.Tag, memory: in.Memory != "", err: err}
	}
	res.Started, res.Restored = true, in.Memory != ""
	return nil
}

// revertGaveUp is a revert whose start failed after its record: the VM is
// off on the snapshot's disks, the snapshot is kept with its memory state,
// and the revert is over (its journal ends: nothing is tried again).
type revertGaveUp struct {
	tag    string
	memory bool
	err    error
}

func (e *revertGaveUp) Error() string {
	what := "did not start again"
	if e.memory {
		what = "did not resume from the snapshot's memory state"
	}
	return fmt.Sprintf("revert to %q: the VM %s (%v); it is off on the snapshot's disks, the snapshot is kept: vmsup up boots it from them",
		e.tag, what, steps.Cause(e.err))
}

func (e *revertGaveUp) Unwrap() error { return e.err }

// checkMemoryRevert refuses, before anything is touched, a revert to
// snap's memory state that the VM could not resume from: one saved with
// another machine type than the VM's pinned one (from the snapshot's
// record, or the state's own header for a snapshot older than the
// record), or with other devices, or gone.
func (s *Service) checkMemoryRevert(name string, snap *snapshottree.Snapshot, app *vmstore.Applied) error {
	saved := snap.Machine
	if saved == "" {
		saved, _ = StateMachine(snap.Memory) // unreadable: QEMU says why at the start
	}
	if saved != "" {
		f, err := s.env.AppliedFile(name)
		if err != nil {
			return err
		}
		now, err := s.env.PinnedMachine(f)
		if err != nil {
			return err
		}
		if spec.MachineVersioned(now) && now != saved {
			return fmt.Errorf("its memory state was saved with machine type %s and the VM is pinned to %s now: QEMU resumes a memory state only on the machine type it was saved with; nothing was changed", saved, now)
		}
	}
	if !sameDevices(snap.Devices, app) {
		return errors.New("the VM's devices changed since the snapshot, so its memory state does not fit them")
	}
	if _, err := os.Stat(snap.Memory); err != nil {
		return fmt.Errorf("its memory state: %w", err)
	}
	return nil
}

// revertOverlays makes each disk's new overlay on its frozen image (one
// made before a kill is kept: nothing was written to it yet).
func (s *Service) revertOverlays(ctx context.Context, in *revertIntent) error {
	for _, l := range in.Layers {
		if exists(l.Overlay.Path) {
			continue
		}
		info, err := s.env.Tools().Info(ctx, l.Base.Path, l.Base.Format)
		if err != nil {
			return fmt.Errorf("disk %q: %w", l.Disk, err)
		}
		if err := s.env.Tools().CreateOverlay(ctx, l.Overlay.Path, l.Base.Path, l.Base.Format, info.VirtualSize); err != nil {
			return fmt.Errorf("disk %q: %w", l.Disk, err)
		}
	}
	return nil
}
