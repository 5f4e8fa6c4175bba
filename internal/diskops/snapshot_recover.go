package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/internal/snapshot"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
)

// recoverSnapshot finishes or undoes a snapshot whose command died. A
// guest on its overlays keeps them (the snapshot is recorded: nothing the
// guest wrote since is lost); one still on its old images gets the
// overlays removed. Either way the guest is thawed and, if the snapshot
// paused it, resumed.
func (s *Service) recoverSnapshot(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[snapIntent](op)
	if err != nil {
		return "", err
	}
	tree, err := snapshot.Load(s.paths(name).Snapshots())
	if err != nil {
		return "", err
	}
	if tree.Find(in.Tag) != nil {
		return "it was recorded", s.settleGuest(ctx, name, in, op.Has(stepFrozen))
	}
	// The state file is whole once QEMU finished writing it ("saved", or
	// the switch step, which saves it, was journaled); else it goes and
	// the snapshot is recorded without memory.
	if in.Snap.Memory != "" && !op.Has(stepSnapSwitch) && !op.Has(stepSaved) {
		os.Remove(in.Snap.Memory)
		in.Snap.Memory = ""
	}
	c, release, err := s.h.QMPSession(ctx, name)
	switch {
	case err == nil:
		defer release()
		switched, err := onOverlays(ctx, c, in.Layers)
		if err != nil {
			return "", err
		}
		if len(in.Layers) == 0 { // RBD disks only: the switch step made their snapshots
			switched = op.Has(stepSnapSwitch)
		}
		serr := s.settleGuestWith(ctx, name, c, in, op.Has(stepFrozen))
		if switched {
			return "the disks ran on the new overlays: recorded the snapshot", errors.Join(s.recordTaken(name, in), serr)
		}
		delOverlayNodes(ctx, c, in.Layers)
		_ = s.h.ReleasePaths(ctx, name, rulePaths(overlayRules(in.Layers))...)
		removeLayerFiles(in.Layers)
		s.removeRBDSnaps(ctx, in)
		return "the disks had not switched: removed the overlays", serr
	case errors.Is(err, vmstate.ErrNotRunning), errors.Is(err, vmstate.ErrNotFound):
		// QEMU is gone: whether it switched cannot be asked. Keeping the
		// overlays is right either way (an empty one reads as its base).
		for _, l := range in.Layers {
			if !exists(l.Overlay.Path) {
				removeLayerFiles(in.Layers)
				s.removeRBDSnaps(ctx, in)
				return "the overlays were not all made: removed them", nil
			}
		}
		if len(in.RBD) > 0 && !op.Has(stepSnapRBD) && !op.Has(stepSnapSwitch) {
			removeLayerFiles(in.Layers)
			s.removeRBDSnaps(ctx, in)
			return "the RBD snapshots were not all made: removed them", nil
		}
		return "recorded the snapshot (the VM is off)", s.recordTaken(name, in)
	default:
		return "", err
	}
}

func removeLayerFiles(layers []snapshot.Layer) {
	for _, l := range layers {
		os.Remove(l.Overlay.Path)
	}
}

func (s *Service) recordTaken(name string, in snapIntent) error {
	p := s.paths(name)
	tree, err := snapshot.Load(p.Snapshots())
	if err != nil {
		return err
	}
	if in.Snap.Quiesced == "" {
		in.Snap.Quiesced = "interrupted; recorded by recovery"
	}
	in.Snap.RBD = rbdSnaps(in)
	tree.Taken(in.Snap, in.Layers)
	return s.saveTree(name, tree)
}

// onOverlays reports whether every disk runs on its new overlay (linked
// onto its base by the transaction); none does after a failed one.
func onOverlays(ctx context.Context, c *qmp.Conn, layers []snapshot.Layer) (bool, error) {
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil {
		return false, err
	}
	for _, l := range layers {
		i := slices.IndexFunc(nodes, func(n qmp.BlockNode) bool { return n.NodeName == qemuargs.OverlayNodeName(l.Overlay.Path) })
		if i < 0 || nodes[i].BackingFile == "" {
			return false, nil
		}
	}
	return len(layers) > 0, nil
}

func (s *Service) settleGuest(ctx context.Context, name string, in snapIntent, frozen bool) error {
	c, release, err := s.h.QMPSession(ctx, name)
	if err != nil {
		return nil // not running: nothing to thaw
	}
	defer release()
	return s.settleGuestWith(ctx, name, c, in, frozen)
}

// settleGuestWith resumes a guest the snapshot paused (a memory save is
// cancelled first) and thaws its filesystems. A thaw that fails counts
// only if the snapshot had frozen them.
func (s *Service) settleGuestWith(ctx context.Context, name string, c *qmp.Conn, in snapIntent, frozen bool) error {
	if !in.Live {
		return nil
	}
	var rerr error
	if in.Paused {
		if mi, err := c.QueryMigrate(ctx); err == nil && (mi.Status == qmp.MigrationActive || mi.Status == qmp.MigrationSetup) {
			_ = c.MigrateCancel(ctx)
			_ = waitMigration(ctx, c, nil)
		}
		if qs, err := c.QueryStatus(ctx); err != nil {
			rerr = err
		} else if !qs.Running {
			if err := c.Cont(ctx); err != nil {
				rerr = fmt.Errorf("resume: %w", err)
			}
		}
	}
	if err := s.thawGuest(ctx, name, c); err != nil && frozen {
		return errors.Join(rerr, err)
	}
	return rerr
}
