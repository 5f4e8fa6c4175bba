package supervisor

import (
	"context"
	"fmt"
	"strings"

	"github.com/vmsup/vmsup/internal/lifecycle/diskprep"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// RemoveVM is Remove, and says what it leaves on disk: the overlays its
// snapshots made (the disks' latest data is in them, not in the files of
// the VM's spec).
func (s *Supervisor) RemoveVM(ctx context.Context, name string) (left []string, err error) {
	if err := spec.ValidName(name); err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	if tree, err := snapshottree.Load(s.env.Paths(name).Snapshots()); err == nil {
		if clones := s.diskops().LiveClones(tree); len(clones) > 0 {
			return nil, vmerr.Wrap(name, fmt.Errorf("VMs %s were cloned from its snapshots and stand on its images: remove them first", strings.Join(clones, ", ")))
		}
		for _, f := range tree.Files() {
			if !strings.HasPrefix(f, s.env.Paths(name).Records) {
				left = append(left, f)
			}
		}
	}
	return left, s.env.Remove(ctx, name)
}

// KeptDisks says which disk images rm kept and which it deleted.
type KeptDisks = diskprep.Kept

// RemoveDisks is RemoveVM that also says which disk images stay and, with
// deleteDisks, deletes the ones vmsup made for the VM (diskprep.PlanRemove).
func (s *Supervisor) RemoveDisks(ctx context.Context, name string, deleteDisks bool) (KeptDisks, error) {
	v, _ := s.env.View(name)
	keep, del := diskprep.PlanRemove(v, s.env.Paths(name), deleteDisks)
	if _, err := s.RemoveVM(ctx, name); err != nil {
		return diskprep.Kept{}, err
	}
	deleted, err := diskprep.DeleteImages(del)
	return diskprep.Kept{Kept: keep, Deleted: deleted}, vmerr.Wrap(name, err)
}
