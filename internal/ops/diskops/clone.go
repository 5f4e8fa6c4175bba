package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// A clone starts a new VM from a booted template's memory snapshot: its
// disks are new qcow2 overlays on the snapshot's frozen images (copy on
// write), and QEMU reads the template's saved state instead of booting.
// The clone gets its own name, UUID, vmgenid (QEMU writes the new id into
// the guest and notifies it, so the guest's RNG reseeds) and NIC MACs; what
// the guest itself holds stays the template's (hostname, machine-id, keys,
// addresses, the MAC its NIC driver read): see the README.

// Clone reports a clone (the supervisor's CloneResult, with its start's
// result).
type Clone struct {
	From  string   // "VM:TAG"
	Disks []string // the clone's overlays
	// File is the VM file vmsup wrote for the clone: the file it belongs
	// to (vmsup up, plan and apply take it, or the clone's name).
	File string
	// Dropped says what of the template the clone does not have (its NICs'
	// host port forwards, whose ports the template holds).
	Dropped []string
}

// UpFromSnapshot starts VM newName from memory snapshot tag of VM src;
// started is what its start said.
func (s *Service) UpFromSnapshot(ctx context.Context, src, tag, newName string) (res Clone, started Started, err error) {
	res = Clone{From: src + ":" + tag}
	fail := func(err error) (Clone, Started, error) {
		return res, started, vmerr.Wrap(newName, fmt.Errorf("clone from %s:%s: %w", src, tag, err))
	}
	if err := spec.ValidVMName(newName); err != nil {
		return fail(err)
	}
	if _, err := os.Stat(s.paths(newName).Records); err == nil {
		return fail(errors.New("a VM of that name exists (vmsup rm it first, or pick another name)"))
	}
	// The template's lock: its tree must not change under the clone.
	lk, err := s.lock(ctx, src, string(opClone))
	if err != nil {
		return res, started, err
	}
	defer lk.Unlock()
	snap, vm, err := s.cloneSource(src, tag)
	if err != nil {
		return fail(err)
	}
	cvm, layers := s.cloneVM(vm, snap, newName)
	in := cloneIntent{Tag: tag, Clone: newName, Layers: layers}
	// Journaled on the template (whose lock it holds): a clone killed
	// half-made is taken back, or kept once it runs (recoverClone).
	op, err := s.k.Begin(ctx, src, opClone, in)
	if err != nil {
		return fail(err)
	}
	defer op.End() // done or undone here; a kill leaves it to recovery
	// A command on the clone's name settles it too (its status would
	// otherwise find nothing of its own and leave a paused QEMU).
	if err := op.Concerns(newName); err != nil {
		return fail(err)
	}
	res.Dropped = droppedForwards(vm)
	started, err = s.makeClone(ctx, src, op, in, cvm, snap.Memory, res.From)
	if err != nil {
		s.undoClone(context.WithoutCancel(ctx), src, in)
		return fail(err)
	}
	for _, l := range layers {
		res.Disks = append(res.Disks, l.Overlay.Path)
	}
	res.File = s.env.State().File(newName)
	return res, started, nil
}

// makeClone makes the clone's overlays and file, notes it in the
// template's tree and starts it from the snapshot's memory (from, "VM:TAG"),
// each part journaled in op.
func (s *Service) makeClone(ctx context.Context, src string, op *operation.Op, in cloneIntent, cvm spec.VM, memory, from string) (Started, error) {
	after := op.After()
	for _, l := range in.Layers {
		info, err := s.env.Tools().Info(ctx, l.Base.Path, l.Base.Format)
		if err == nil {
			err = s.env.Tools().CreateOverlay(ctx, l.Overlay.Path, l.Base.Path, l.Base.Format, info.VirtualSize)
		}
		if err != nil {
			return Started{}, fmt.Errorf("disk %q: %w", l.Disk, err)
		}
	}
	op.Step(stepCloneOverlays)
	f, err := s.cloneFile(cvm)
	if err != nil {
		return Started{}, err
	}
	op.Step(stepCloneFile)
	if err := s.noteClone(src, in.Tag, in.Clone); err != nil {
		return Started{}, err
	}
	op.Step(stepCloneNoted)
	started, err := s.env.StartClone(ctx, f, memory, from, after)
	if err != nil {
		return Started{}, steps.Cause(err)
	}
	s.noteMade(in)
	return started, nil
}

// noteMade notes the clone's overlays as images vmsup made for it (rm
// --delete-disks deletes them).
func (s *Service) noteMade(in cloneIntent) {
	var paths []string
	for _, l := range in.Layers {
		paths = append(paths, l.Overlay.Path)
	}
	if err := s.paths(in.Clone).NoteMade(paths...); err != nil {
		s.env.Opts().Logger.Warn("clone: note its overlays", "vm", in.Clone, "err", err)
	}
}

// cloneFile checks the clone's VM as a file would be and writes it as the
// file the clone belongs to.
func (s *Service) cloneFile(vm spec.VM) (*spec.File, error) {
	f, err := spec.New(vm.Name, vm)
	if err != nil {
		return nil, err
	}
	path, err := s.env.State().WriteVMFile(f.VM)
	if err != nil {
		return nil, fmt.Errorf("its file: %w", err)
	}
	return spec.Load(path)
}

// droppedForwards names the template's host port forwards, which a clone
// does not get (the template holds those host ports).
func droppedForwards(vm *spec.VM) []string {
	var out []string
	for _, n := range vm.NICs {
		for _, fw := range n.Forwards {
			out = append(out, fmt.Sprintf("nic %q forward %s (the template holds its host port; give the clone its own in its file)", n.Name, fw))
		}
	}
	return out
}

// cloneSource reads the template's memory snapshot and the VM it was
// taken of (its recorded spec with the disks attached in that run).
func (s *Service) cloneSource(src, tag string) (*snapshottree.Snapshot, *spec.VM, error) {
	tree, err := snapshottree.Load(s.paths(src).Snapshots())
	if err != nil {
		return nil, nil, err
	}
	snap := tree.Find(tag)
	switch {
	case snap == nil:
		return nil, nil, fmt.Errorf("VM %q has no snapshot %q", src, tag)
	case snap.Memory == "":
		return nil, nil, fmt.Errorf("snapshot %q has no memory (take it with --memory)", tag)
	case len(snap.RBD) > 0:
		return nil, nil, fmt.Errorf("snapshot %q holds RBD disks, which a clone cannot stand on yet (an RBD clone needs a protected snapshot)", tag)
	}
	v, err := s.env.View(src)
	if v == nil {
		return nil, nil, fmt.Errorf("VM %q: %w", src, err)
	}
	if !sameDevices(snap.Devices, v.Applied) {
		return nil, nil, fmt.Errorf("VM %q was started with another spec since snapshot %q: its recorded devices are not the ones the memory state has", src, tag)
	}
	vm := *v.Booted
	if spec.MachineVersioned(v.Applied.Machine) {
		vm.Machine = v.Applied.Machine // the memory state's machine type: the clone's file names it
	}
	vm.Disks = nil
	for _, d := range v.Disks { // as QEMU opens them: moved, then attached (carried at boot)
		vm.Disks = append(vm.Disks, d.Disk)
	}
	return snap, &vm, nil
}

// cloneVM is the template's VM as the clone: another name, no UUID (a
// new one is made), new MACs, and its writable disks on new overlays on
// the snapshot's images (the layers, made by makeClone).
func (s *Service) cloneVM(vm *spec.VM, snap *snapshottree.Snapshot, name string) (spec.VM, []snapshottree.Layer) {
	c := *vm
	c.Name, c.UUID = name, ""
	c.NICs = append([]spec.NIC(nil), vm.NICs...)
	for i := range c.NICs {
		c.NICs[i].MAC = "" // derived from the new name
		c.NICs[i].Forwards = nil
	}
	c.Disks = append([]spec.Disk(nil), vm.Disks...)
	var layers []snapshottree.Layer
	for i, d := range c.Disks {
		im, ok := snap.Disks[d.Name]
		if !ok {
			continue // a CD-ROM: the same medium
		}
		dir := filepath.Dir(d.File)
		if in, err := s.env.Confiner().InImageDirs(d.File); err != nil || !in {
			dir = s.env.Opts().ImageDirs[0]
		}
		path := filepath.Join(dir, name+"-"+d.Name+".qcow2")
		layers = append(layers, snapshottree.Layer{Disk: d.Name, Base: im, Overlay: snapshottree.Image{Path: path, Format: spec.FormatQcow2}})
		d.File, d.Format, d.Backing, d.Size = path, spec.FormatQcow2, "", 0
		c.Disks[i] = d
	}
	return c, layers
}

// noteClone records in the template's tree that newName stands on the
// snapshot's images, so they are not merged away under it.
func (s *Service) noteClone(src, tag, newName string) error {
	p := s.paths(src)
	tree, err := snapshottree.Load(p.Snapshots())
	if err != nil {
		return err
	}
	snap := tree.Find(tag)
	snap.Clones = append(snap.Clones, newName)
	return s.saveTree(src, tree)
}

// LiveClones lists the clones that still exist of the tree's snapshots
// (they stand on its images).
func (s *Service) LiveClones(tree *snapshottree.Tree) []string {
	var out []string
	for _, sn := range tree.Snapshots {
		for _, c := range sn.Clones {
			if _, err := os.Stat(s.paths(c).Records); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
