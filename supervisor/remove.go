package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vmsup/vmsup/internal/lifecycle/diskprep"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// Remove forgets a VM that is not running ("virsh undefine"): its state
// directory, vmsup's records, leftovers of its host set-up and its autostart
// mark. Disk images are the user's and stay. A running VM is refused.
func (s *Supervisor) Remove(ctx context.Context, name string) error {
	_, err := s.RemoveVM(ctx, name)
	return err
}

// RemoveVM is Remove, and says what it leaves on disk: the overlays its
// snapshots made (the disks' latest data is in them, not in the files of
// the VM's spec).
func (s *Supervisor) RemoveVM(ctx context.Context, name string) (left []string, err error) {
	if err := spec.ValidName(name); err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	if tree, err := snapshottree.Load(s.paths(name).Snapshots()); err == nil {
		if clones := s.diskops().LiveClones(tree); len(clones) > 0 {
			return nil, vmerr.Wrap(name, fmt.Errorf("VMs %s were cloned from its snapshots and stand on its images: remove them first", strings.Join(clones, ", ")))
		}
		for _, f := range tree.Files() {
			if !strings.HasPrefix(f, s.paths(name).Records) {
				left = append(left, f)
			}
		}
	}
	return left, s.remove(ctx, name)
}

// KeptDisks says which disk images rm kept and which it deleted.
type KeptDisks = diskprep.Kept

// RemoveDisks is RemoveVM that also says which disk images stay and, with
// deleteDisks, deletes the ones vmsup made for the VM (diskprep.PlanRemove).
func (s *Supervisor) RemoveDisks(ctx context.Context, name string, deleteDisks bool) (KeptDisks, error) {
	v, _ := s.view(name)
	keep, del := diskprep.PlanRemove(v, s.paths(name), deleteDisks)
	if _, err := s.RemoveVM(ctx, name); err != nil {
		return diskprep.Kept{}, err
	}
	deleted, err := diskprep.DeleteImages(del)
	return diskprep.Kept{Kept: keep, Deleted: deleted}, vmerr.Wrap(name, err)
}

func (s *Supervisor) remove(ctx context.Context, name string) error {
	lu, err := s.lockUnit(ctx, name, "rm")
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
	p := s.paths(name)
	known := s.autostart().IsEnabled(name)
	for _, d := range []string{p.Dir, p.Records} {
		if _, err := os.Stat(d); err == nil {
			known = true
		}
	}
	if !known {
		return s.notFound(name)
	}
	// What a crash may have left: taps, grants, secrets.
	if err := s.afterStop(ctx, name); err != nil {
		return err
	}
	if s.autostart().IsEnabled(name) {
		if err := s.Disable(ctx, name); err != nil {
			return err
		}
	}
	if err := errors.Join(p.RemoveAll(), s.state.RemoveVMFile(name)); err != nil {
		return vmerr.Wrap(name, err)
	}
	// Its vsock CID was kept from start to start: free for others now.
	if err := s.vsocks().Release(ctx, name); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("vsock: %w", err))
	}
	return nil
}
