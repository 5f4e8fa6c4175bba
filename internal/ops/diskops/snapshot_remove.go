package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Removing a snapshot merges, for each disk, the one image built on its
// frozen image down into it: live with QEMU's block-commit (an active
// commit pivots the disk onto the merged image), offline with qemu-img.
// Each part can be done again, so a killed removal is finished by running
// it again (recovery).

const opSnapshotRemove operation.Kind = "snapshot-rm"

type snapRmIntent struct {
	Tag    string               `json:"tag"`
	Merges []snapshottree.Merge `json:"merges"`
	Memory string               `json:"memory,omitempty"`
	RBD    []spec.Disk          `json:"rbd,omitempty"` // their RBD snapshots go
}

// RemoveSnapshot removes snapshot tag of VM name, running or off.
// progress, when set, sees each live merge go.
func (s *Service) RemoveSnapshot(ctx context.Context, name, tag string, progress func(disk string, done, total int64)) error {
	fail := func(err error) error { return vmerr.Wrap(name, fmt.Errorf("remove snapshot %q: %w", tag, err)) }
	lk, err := s.lock(ctx, name, string(opSnapshotRemove))
	if err != nil {
		return err
	}
	defer lk.Unlock()
	tree, err := snapshottree.Load(s.paths(name).Snapshots())
	if err != nil {
		return fail(err)
	}
	if clones := s.LiveClones(tree); len(clones) > 0 {
		return fail(fmt.Errorf("VMs %s were cloned from its snapshots and stand on their images: remove them first", strings.Join(clones, ", ")))
	}
	snap, merges, err := tree.PlanRemove(tag)
	if err != nil {
		return fail(err)
	}
	in := snapRmIntent{Tag: tag, Merges: merges, Memory: snap.Memory}
	if len(snap.RBD) > 0 {
		v, err := s.env.View(name)
		if err != nil && !errors.Is(err, vmstore.ErrNotRunning) {
			return fail(err)
		}
		disks, err := s.snapshotDisks(v)
		if err != nil {
			return fail(err)
		}
		for _, d := range disks.rbd {
			if _, ok := snap.RBD[d.Name]; ok {
				in.RBD = append(in.RBD, d)
			}
		}
	}
	op, err := s.k.Begin(ctx, name, opSnapshotRemove, in)
	if err != nil {
		return fail(err)
	}
	if err := s.finishRemove(ctx, name, op, in, progress); err != nil {
		return fail(err) // the journal stays: the next command finishes it
	}
	op.End()
	s.env.Lifecycle(name, "snapshot-rm", map[string]any{"tag": tag})
	return nil
}

func (s *Service) recoverSnapshotRemove(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[snapRmIntent](op)
	if err != nil {
		return "", err
	}
	if err := s.finishRemove(ctx, name, op, in, nil); err != nil {
		return "", err
	}
	return fmt.Sprintf("removed snapshot %q", in.Tag), nil
}

// finishRemove merges, records, then deletes the merged files.
func (s *Service) finishRemove(ctx context.Context, name string, op *operation.Op, in snapRmIntent, progress func(string, int64, int64)) error {
	p := s.paths(name)
	tree, err := snapshottree.Load(p.Snapshots())
	if err != nil {
		return err
	}
	if tree.Find(in.Tag) != nil { // not recorded yet: merge
		c, qemu, release, err := s.session(ctx, name) // c nil: QEMU is gone, merged offline
		defer release()
		if qemu == qemuUnknown {
			return err
		}
		for _, m := range in.Merges {
			if m.From == nil || op.Has(stepMerged(m.Disk)) {
				continue // nothing above Into, or merged before a kill
			}
			if err := s.merge(ctx, name, c, op, m, progress); err != nil {
				return fmt.Errorf("disk %q: %w", m.Disk, err)
			}
			op.Step(stepMerged(m.Disk))
		}
		for _, d := range in.RBD {
			if err := s.env.Tools().RBDSnap(ctx, d, "rm", snapshottree.RBDSnapName(in.Tag)); err != nil {
				return fmt.Errorf("disk %q: %w", d.Name, err)
			}
		}
		tree.Removed(in.Tag, in.Merges)
		if err := s.saveTree(name, tree); err != nil {
			return err
		}
	}
	var drop []string
	for _, m := range in.Merges {
		if m.Drop != "" {
			drop = append(drop, m.Drop)
		}
	}
	if in.Memory != "" {
		drop = append(drop, in.Memory)
	}
	for _, f := range drop {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
