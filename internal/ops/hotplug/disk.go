package hotplug

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/diskfds"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// The disk hot-plug operations in the journal.
const (
	opDiskAttach operation.Kind = "disk-attach"
	opDiskDetach operation.Kind = "disk-detach"
)

// A disk attach's own host steps (Step names them: `disk "data": prepare`).
const (
	stepPrepare operation.Step = "prepare"
	stepAddFD   operation.Step = "add-fd"
)

func diskKind() kind {
	return kind{attach: opDiskAttach, detach: opDiskDetach, load: func(e *Engine, vm string, o *operation.Op) (Device, error) {
		in, err := operation.IntentOf[diskIntent](o)
		return &disk{e: e, vm: vm, in: in}, err
	}}
}

// AttachResult reports a hot-plugged disk.
type AttachResult struct {
	VM, Disk string
	// Bus is the root port (q35) or "pci.0" (pc) the disk went into; "" when
	// the VM was shut off and the disk is only recorded for its next up.
	Bus string
}

// diskIntent is a disk hot-plug's, attach or detach: the disk, where it
// goes, and every part of it QEMU may have.
type diskIntent struct {
	Disk     spec.Disk `json:"disk"`
	Bus      string    `json:"bus"`
	NewImage bool      `json:"new_image,omitempty"` // the image did not exist: the attach creates it
	Devices  []string  `json:"devices"`
	Nodes    []string  `json:"nodes"`
	Objects  []string  `json:"objects"`
	Rules    []string  `json:"rules,omitempty"`     // paths granted to QEMU's user
	FromFile bool      `json:"from_file,omitempty"` // a disk of the VM's file (apply): recorded in its spec
}

func newDiskIntent(d spec.Disk, bus string) diskIntent {
	in := diskIntent{Disk: d, Bus: bus}
	if d.Type == spec.DiskFile {
		_, err := os.Stat(d.File)
		in.NewImage = errors.Is(err, os.ErrNotExist)
	}
	// The parts' ids do not depend on the host files.
	if parts, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: "/dev/null", SecretFile: "/dev/null"}, bus); err == nil {
		for _, x := range parts.Devices {
			in.Devices = append(in.Devices, x.ID)
		}
		for _, x := range parts.Blockdevs {
			in.Nodes = append(in.Nodes, x.NodeName)
		}
		for _, x := range parts.Objects {
			in.Objects = append(in.Objects, x.ID)
		}
	}
	return in
}

// AttachDisk hot-plugs d into the running VM: the same checks and host
// preparation as at boot, then over QMP the disk's objects (secret,
// iothread), its block nodes and its device(s) into a free hotplug root
// port, built by qemuargs.Disk exactly as at boot. Whatever was added is
// removed again if a later part fails. The applied state records the disk,
// so status lists it and the next up boots with it. For a VM that is shut
// off, the disk is checked and only recorded. fromFile: a disk of the VM's
// file (apply), recorded in the record's spec rather than as attached by
// hand.
func (e *Engine) AttachDisk(ctx context.Context, vm string, d spec.Disk, fromFile bool) (AttachResult, error) {
	r := &diskAttach{e: e, vm: vm, d: d, fromFile: fromFile, res: AttachResult{VM: vm, Disk: d.Name}}
	err := e.attach(ctx, vm, r)
	return r.res, err
}

// diskAttach is a disk's attach as its kind checks it.
type diskAttach struct {
	e        *Engine
	vm       string
	d        spec.Disk
	fromFile bool
	res      AttachResult
}

func (r *diskAttach) kind() kind { return diskKind() }

func (r *diskAttach) fail(err error) error {
	return opErr(r.vm, fmt.Sprintf("attach disk %q", r.d.Name), steps.Cause(err))
}

func (r *diskAttach) check(ctx context.Context, v *vmstore.View, down error) (bool, error) {
	d := r.d
	if err := spec.ValidName(d.Name); err != nil {
		return false, err
	}
	if err := r.e.env.CheckDiskPaths(ctx, d); err != nil {
		return false, err
	}
	if have := v.Disk(d.Name); have != nil && have.Attached {
		return false, fmt.Errorf("the VM already has a disk named %q (attached)", d.Name)
	} else if have != nil {
		return false, fmt.Errorf("the VM already has a disk named %q", d.Name)
	}
	t := r.e.env.Tools()
	if down != nil && r.fromFile {
		return false, down
	}
	if down != nil {
		// Nothing to plug: record it, and the next up boots with it.
		if err := t.Check(ctx, d); err != nil {
			return false, err
		}
		app := v.Applied
		app.Attached = append(app.Attached, vmstore.AttachedDisk{Disk: d})
		if err := r.e.state().RewriteApplied(app); err != nil {
			return false, fmt.Errorf("record: %w", err)
		}
		return true, nil
	}
	if d.Bus == spec.BusSATA {
		return false, errors.New("a SATA disk cannot be hot-plugged (QEMU's AHCI has no hotplug): use bus \"scsi\" or \"virtio\", or attach it while the VM is stopped")
	}
	probe := d // logs in as QEMU will; the recorded disk stays as given
	probe.InitiatorName = d.InitiatorFor(v.Applied.UUID)
	return false, t.Check(ctx, probe)
}

func (r *diskAttach) plug(_ context.Context, v *vmstore.View, c *qmp.Conn, bus string) (Plug, error) {
	r.res.Bus = bus
	if r.d.Type != spec.DiskBlock {
		if err := r.e.env.Reachable(r.d.File, r.d.Backing); err != nil {
			return nil, err
		}
	}
	in := newDiskIntent(r.d, bus)
	in.FromFile = r.fromFile
	return &disk{e: r.e, vm: r.vm, in: in, c: c, uuid: v.Applied.UUID}, nil
}

// DetachDisk hot-unplugs a disk attached with AttachDisk: device_del, wait
// for DEVICE_DELETED, then blockdev-del of its nodes and object-del of its
// objects. A guest that does not release the device within the unplug
// timeout leaves the disk attached and gets an error saying so; a later
// DetachDisk finishes the job once the guest let go. fromFile: a disk of
// the VM's file that the file no longer has (apply), unplugged from the
// running VM.
func (e *Engine) DetachDisk(ctx context.Context, vm, name string, fromFile bool) error {
	return e.detach(ctx, vm, &diskDetach{e: e, vm: vm, name: name, fromFile: fromFile})
}

// diskDetach is a disk's detach as its kind checks it.
type diskDetach struct {
	e        *Engine
	vm, name string
	fromFile bool
}

func (r *diskDetach) kind() kind { return diskKind() }

func (r *diskDetach) fail(err error) error {
	return opErr(r.vm, fmt.Sprintf("detach disk %q", r.name), err)
}

func (r *diskDetach) find(ctx context.Context, v *vmstore.View, down error) (Device, error) {
	app, vd := v.Applied, v.Disk(r.name)
	if r.fromFile {
		if down != nil {
			return nil, down
		}
		if vd == nil || vd.Attached {
			return nil, errors.New("the VM does not run with it")
		}
		return r.e.detaching(ctx, r.vm, vmstore.AttachedDisk{Disk: vd.Disk}), nil
	}
	if v.Tree.HasDisk(r.name) {
		return nil, errors.New("it is in the VM's snapshots: remove them first (vmsup snapshot rm)")
	}
	i := slices.IndexFunc(app.Attached, func(a vmstore.AttachedDisk) bool { return a.Disk.Name == r.name })
	if i < 0 {
		if vd != nil {
			return nil, errors.New("it is in the VM's file; remove it there and restart the VM")
		}
		return nil, errors.New("no such attached disk")
	}
	if down != nil { // shut off: only the record
		if err := dropDisk(app, r.name); err != nil {
			return nil, err
		}
		if err := r.e.state().RewriteApplied(app); err != nil {
			return nil, fmt.Errorf("record: %w", err)
		}
		return nil, storage.RemoveSecret(r.e.state().Paths(r.vm).Dir, r.name)
	}
	// Running: plugged in now, or at boot (its own root port either way).
	return r.e.detaching(ctx, r.vm, app.Attached[i]), nil
}

// detaching is attached disk a as its detach takes it out: the paths it
// was granted are in its intent.
func (e *Engine) detaching(ctx context.Context, vm string, a vmstore.AttachedDisk) *disk {
	in := newDiskIntent(a.Disk, a.Bus)
	rules, _ := confine.DiskRules(ctx, a.Disk)
	in.Rules = rulePaths(rules)
	if _, sec := storage.HostFiles(e.state().Paths(vm).Dir, a.Disk); sec != "" {
		in.Rules = append(in.Rules, sec)
	}
	return &disk{e: e, vm: vm, in: in, fdset: a.FDSet}
}

// disk is one disk as the engine plugs, unplugs and recovers it: its
// intent and, while it is attached, what its host steps made.
type disk struct {
	e     *Engine
	vm    string
	in    diskIntent
	c     *qmp.Conn // an attach's QEMU
	uuid  string    // the VM's (an iSCSI initiator's name)
	prep  storage.Prepared
	image string
	fdset *int64 // a block device's fd set in QEMU
	rules []units.PathRule
	// chain: a file disk's parts on its descriptors (internal/lifecycle/diskfds),
	// set by its add-fd step; sets are its fd sets.
	chain *qemuargs.DiskParts
	sets  []int64
}

var _ Plug = (*disk)(nil)

func (d *disk) Label() string                        { return fmt.Sprintf("disk %q", d.in.Disk.Name) }
func (d *disk) Step(s operation.Step) operation.Step { return operation.Step(d.Label()+": ") + s }
func (d *disk) Intent() any                          { return d.in }
func (d *disk) Recorded(app *vmstore.Applied) bool   { return hasDisk(app, d.in.Disk.Name) }
func (d *disk) Forget(app *vmstore.Applied) error    { return dropDisk(app, d.in.Disk.Name) }

func (d *disk) ID() string {
	if len(d.in.Devices) == 0 {
		return ""
	}
	return d.in.Devices[0]
}

func (d *disk) Record(app *vmstore.Applied, pr *qdev.Present) error {
	a := vmstore.AttachedDisk{Disk: d.in.Disk, Bus: d.in.Bus, FDSet: d.fdset}
	if pr != nil {
		if id, ok := pr.FDSets[qdev.FDOpaque(d.in.Disk.Name)]; ok {
			a.FDSet = &id
		}
	}
	return recordDisk(app, a, d.in.FromFile)
}

func (d *disk) dir() string { return d.e.state().Paths(d.vm).Dir }

// HostSteps are what boot does for a disk (storage.Prepare, the
// confinement's grants), plus handing a block device to QEMU as a
// descriptor.
func (d *disk) HostSteps(op *operation.Op) []steps.Step {
	sd := d.in.Disk
	list := []steps.Step{{Name: string(d.Step(stepPrepare)), Do: func(ctx context.Context) (err error) {
		d.prep, err = d.e.env.Tools().Prepare(ctx, sd, d.dir())
		d.image = d.prep.Image
		return err
	}, Undo: func(context.Context) { d.prep.Undo() }}}
	if sd.Type != spec.DiskBlock && qemuargs.PassedByFD(sd, d.dir()) {
		// As at boot: QEMU gets the image and its chain as descriptors,
		// and its user needs no grant on them.
		return append(list, steps.Step{Name: string(d.Step(stepAddFD)), Do: func(ctx context.Context) error {
			parts, err := qemuargs.Disk(sd, qemuargs.DiskHost{Image: d.image, UUID: d.uuid}, d.in.Bus)
			if err != nil {
				return err
			}
			chain, sets, err := diskfds.Pass(ctx, d.c, sd, "", parts, d.e.env.Places().OpenDisk)
			if err != nil {
				return err
			}
			d.chain, d.sets = &chain, sets
			return nil
		}, Undo: func(ctx context.Context) { diskfds.RemoveSets(ctx, d.c, d.sets) }})
	}
	if sd.Type == spec.DiskBlock {
		list = append(list, steps.Step{Name: string(d.Step(stepAddFD)), Do: func(ctx context.Context) error {
			id, err := qdev.PassBlockDevice(ctx, d.c, sd)
			if err != nil {
				return err
			}
			d.fdset, d.image = &id, fmt.Sprintf("/dev/fdset/%d", id)
			return nil
		}, Undo: func(ctx context.Context) { _ = d.c.RemoveFD(ctx, *d.fdset, nil) }})
	}
	// The unprivileged QEMU (and its AppArmor profile) must be able to open
	// the disk's files before blockdev-add: the image and its chain, and a
	// secret file made by Prepare.
	return append(list, steps.Step{Name: string(d.Step(stepConfine)), Do: func(ctx context.Context) (err error) {
		if d.rules, err = confine.DiskRules(ctx, sd); err != nil {
			return err
		}
		if d.prep.SecretFile != "" {
			d.rules = append(d.rules, units.PathRule{Path: d.prep.SecretFile, Mode: "r"})
		}
		// Journaled before the grants, so that a kill between them leaves
		// nothing unknown.
		d.in.Rules = rulePaths(d.rules)
		if err := op.SetIntent(d.in); err != nil {
			return err
		}
		return d.e.env.ConfinePaths(ctx, d.vm, d.rules...)
	}, Undo: func(ctx context.Context) { _ = d.e.env.ReleasePaths(ctx, d.vm, rulePaths(d.rules)...) }})
}

// Parts are the disk's objects, block nodes and devices, as qemuargs.Disk
// renders them at boot.
func (d *disk) Parts() ([]steps.Step, error) {
	if d.chain != nil {
		return qdev.PlugDisk(d.c, d.in.Disk.Name, *d.chain, d.e.unplugTimeout()), nil
	}
	parts, err := qemuargs.Disk(d.in.Disk, qemuargs.DiskHost{Image: d.image, SecretFile: d.prep.SecretFile, UUID: d.uuid}, d.in.Bus)
	if err != nil {
		return nil, err
	}
	return qdev.PlugDisk(d.c, d.in.Disk.Name, parts, d.e.unplugTimeout()), nil
}

// Unplug: device_del and the wait for the guest, the disk's nodes (where a
// move put them) and objects, its fd set.
func (d *disk) Unplug(ctx context.Context, c *qmp.Conn) error {
	sd := d.in.Disk
	img, sec := storage.HostFiles(d.dir(), sd)
	parts, err := qemuargs.Disk(sd, qemuargs.DiskHost{Image: img, SecretFile: sec}, d.in.Bus)
	if err != nil {
		return err
	}
	if parts, err = qdev.MovedParts(ctx, c, d.dir(), sd, parts); err != nil {
		return err
	}
	if err := qdev.UnplugDisk(ctx, c, parts, d.e.unplugTimeout()); err != nil {
		return err
	}
	if d.fdset != nil {
		return c.RemoveFD(ctx, *d.fdset, nil)
	}
	// Plugged by apply (a block device) or booted as descriptors
	// (internal/lifecycle/diskfds): its fd sets are known to QEMU by their notes,
	// with its bases' nodes.
	return qdev.RemoveChain(ctx, c, sd.Name)
}

// RemoveParts removes what QEMU has of a disk that is not in the guest:
// nodes top first, objects, its fd set.
func (d *disk) RemoveParts(ctx context.Context, c *qmp.Conn, pr qdev.Present) error {
	in := d.in
	var errs []error
	for i := len(in.Devices) - 1; i >= 0; i-- {
		if pr.Devices[in.Devices[i]] {
			errs = append(errs, qdev.Unplug(ctx, c, "disk", in.Devices[i], d.e.unplugTimeout()))
		}
	}
	for i := len(in.Nodes) - 1; i >= 0; i-- {
		if pr.Nodes[in.Nodes[i]] {
			errs = append(errs, c.BlockdevDel(ctx, in.Nodes[i]))
		}
	}
	for i := len(in.Objects) - 1; i >= 0; i-- {
		if pr.Objects[in.Objects[i]] {
			errs = append(errs, c.ObjectDel(ctx, in.Objects[i]))
		}
	}
	if id, ok := pr.FDSets[qdev.FDOpaque(in.Disk.Name)]; ok {
		errs = append(errs, c.RemoveFD(ctx, id, nil))
	}
	// Plugged as descriptors: its bases' nodes and its chain's fd sets.
	errs = append(errs, qdev.RemoveChain(ctx, c, in.Disk.Name))
	return errors.Join(errs...)
}

// Release shrinks the confinement again (the grants of its attach) and
// removes the disk's secret copy.
func (d *disk) Release(ctx context.Context) error {
	if err := d.e.env.ReleasePaths(ctx, d.vm, d.in.Rules...); err != nil {
		return err
	}
	return storage.RemoveSecret(d.dir(), d.in.Disk.Name)
}

// Undo takes back a rolled-back attach's host side: its grants, the secret
// copy and seed it made, and the image it created.
func (d *disk) Undo(ctx context.Context) (string, error) {
	in := d.in
	if len(in.Rules) > 0 {
		if err := d.e.env.ReleasePaths(ctx, d.vm, in.Rules...); err != nil {
			d.e.logger().Warn("recover: release grants", "vm", d.vm, "err", err)
		}
	}
	_ = storage.RemoveSecret(d.dir(), in.Disk.Name)
	if in.Disk.Type == spec.DiskSeed {
		os.Remove(storage.SeedPath(d.dir(), in.Disk.Name))
	}
	if in.NewImage && in.Disk.File != "" {
		os.Remove(in.Disk.File) // the attach made it: nothing else can have written it
	}
	return "its parts, grants and files are removed", nil
}

func rulePaths(rules []units.PathRule) []string {
	paths := make([]string, len(rules))
	for i, r := range rules {
		paths[i] = r.Path
	}
	return paths
}
