package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// opClone is a clone's journal, on its template: made under the
// template's lock, so that the template's next command settles a clone
// whose command died.
const opClone operation.Kind = "clone"

// Steps of a clone in the journal (before its start's own steps).
const (
	stepCloneOverlays operation.Step = "overlays" // the clone's overlays are made
	stepCloneFile     operation.Step = "file"     // its file is written
	stepCloneNoted    operation.Step = "noted"    // the template's tree names it
)

// cloneIntent names what a clone makes: its overlays (on the snapshot's
// images), its file, its note in the template's tree, its unit.
type cloneIntent struct {
	Tag    string               `json:"tag"`
	Clone  string               `json:"clone"`
	Layers []snapshottree.Layer `json:"layers"`
}

// cloneAction is what recovery does with a clone whose command died.
type cloneAction uint8

const (
	cloneKeep cloneAction = iota + 1 // it runs (its QEMU resumed the template's memory): kept, noted in the template's tree
	cloneUndo                        // anything less: taken back whole
)

// note is what recovery says it did (the CLI shows it).
func (a cloneAction) note(clone string) string {
	if a == cloneKeep {
		return fmt.Sprintf("clone %s runs: kept it", clone)
	}
	return fmt.Sprintf("clone %s had not started: removed what was made of it", clone)
}

// decideClone is what recovery does with a clone: runs, the clone's QEMU
// runs (its start, under the clone's own lock, resumed the template's
// memory).
func decideClone(runs bool) cloneAction {
	if runs {
		return cloneKeep
	}
	return cloneUndo
}

// recoverClone settles a clone whose command died (decideClone).
func (s *Service) recoverClone(ctx context.Context, src string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[cloneIntent](op)
	if err != nil {
		return "", err
	}
	a := decideClone(s.env.Running(ctx, in.Clone))
	if a == cloneKeep {
		if err := s.noteCloneOnce(src, in.Tag, in.Clone); err != nil {
			return "", err
		}
		s.noteMade(in)
	} else if err := s.undoClone(ctx, src, in); err != nil {
		return "", err
	}
	return a.note(in.Clone), nil
}

// undoClone takes back what a clone made: its QEMU if one started, its
// records and file, its overlays, its note in the template's tree.
func (s *Service) undoClone(ctx context.Context, src string, in cloneIntent) error {
	var errs []error
	if _, err := s.env.Kill(ctx, in.Clone); err != nil && !errors.Is(err, vmstore.ErrNotFound) && !errors.Is(err, vmstore.ErrNotRunning) {
		errs = append(errs, fmt.Errorf("kill the clone: %w", err))
	}
	if err := s.env.Remove(ctx, in.Clone); err != nil && !errors.Is(err, vmstore.ErrNotFound) {
		errs = append(errs, fmt.Errorf("remove the clone: %w", err))
	}
	if err := s.env.State().RemoveVMFile(in.Clone); err != nil {
		errs = append(errs, err)
	}
	for _, l := range in.Layers {
		if err := os.Remove(l.Overlay.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := s.unnoteClone(src, in.Tag, in.Clone); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// noteCloneOnce is noteClone unless the tree has it already.
func (s *Service) noteCloneOnce(src, tag, clone string) error {
	tree, err := snapshottree.Load(s.paths(src).Snapshots())
	if err != nil {
		return err
	}
	if sn := tree.Find(tag); sn != nil && slices.Contains(sn.Clones, clone) {
		return nil
	}
	return s.noteClone(src, tag, clone)
}

// unnoteClone drops clone from the template's tree.
func (s *Service) unnoteClone(src, tag, clone string) error {
	tree, err := snapshottree.Load(s.paths(src).Snapshots())
	if err != nil {
		return err
	}
	sn := tree.Find(tag)
	if sn == nil || !slices.Contains(sn.Clones, clone) {
		return nil
	}
	sn.Clones = slices.DeleteFunc(sn.Clones, func(c string) bool { return c == clone })
	return s.saveTree(src, tree)
}
