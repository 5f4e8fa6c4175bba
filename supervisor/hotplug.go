package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/confine"
	"github.com/vmsup/vmsup/internal/devices"
	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// DefaultUnplugTimeout is how long an unplug (a disk, a NIC, a DIMM) waits
// for the guest to release the device (DEVICE_DELETED) before it gives up
// and leaves the device attached (Options.UnplugTimeout).
const DefaultUnplugTimeout = 20 * time.Second

// Steps of an unplug in the journal, per device (kind "disk" or "nic").
func stepUnplugged(kind, name string) operation.Step {
	return operation.Step(fmt.Sprintf("%s %q: unplugged", kind, name))
}
func stepReleased(kind, name string) operation.Step {
	return operation.Step(fmt.Sprintf("%s %q: released", kind, name))
}

// The disk hot-plug operations in the journal.
const (
	opDiskAttach operation.Kind = "disk-attach"
	opDiskDetach operation.Kind = "disk-detach"
)

// AttachResult reports a hot-plugged disk.
type AttachResult struct {
	VM, Disk string
	// Bus is the root port (q35) or "pci.0" (pc) the disk went into; "" when
	// the VM was shut off and the disk is only recorded for its next up.
	Bus string
}

// AttachDisk hot-plugs d into the running VM name: the same checks and host
// preparation as at boot, then over QMP the disk's objects (secret,
// iothread), its block nodes and its device(s) into a free hotplug root
// port, built by qemuargs.Disk exactly as at boot. Whatever was added is
// removed again if a later part fails. The applied state records the disk,
// so status lists it and the next up boots with it. For a VM that is shut
// off, the disk is checked and only recorded.
func (s *Supervisor) AttachDisk(ctx context.Context, name string, d spec.Disk) (AttachResult, error) {
	return s.attachDisk(ctx, name, d, false)
}

// attachDisk is AttachDisk; fromFile: a disk of the VM's file (apply),
// recorded in the record's spec rather than as attached by hand.
func (s *Supervisor) attachDisk(ctx context.Context, name string, d spec.Disk, fromFile bool) (AttachResult, error) {
	res := AttachResult{VM: name, Disk: d.Name}
	fail := func(err error) (AttachResult, error) {
		return res, vmErr(name, fmt.Errorf("attach disk %q: %w", d.Name, err))
	}
	lk, err := s.lock(ctx, name, "disk-attach")
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	v, err := s.view(name)
	stopped := errors.Is(err, ErrNotRunning)
	if err != nil && !stopped {
		return fail(err)
	}
	app, vm := v.Applied, v.Booted
	if err := spec.ValidName(d.Name); err != nil {
		return fail(err)
	}
	if err := s.checkDiskPaths(ctx, d); err != nil {
		return fail(err)
	}
	if have := v.Disk(d.Name); have != nil && have.Attached {
		return fail(fmt.Errorf("the VM already has a disk named %q (attached)", d.Name))
	} else if have != nil {
		return fail(fmt.Errorf("the VM already has a disk named %q", d.Name))
	}
	t := s.tools()
	if stopped && fromFile {
		return fail(ErrNotRunning)
	}
	if stopped {
		// Nothing to plug: record it, and the next up boots with it.
		if err := t.Check(ctx, d); err != nil {
			return fail(err)
		}
		app.Attached = append(app.Attached, AttachedDisk{Disk: d})
		if err := s.state.RewriteApplied(app); err != nil {
			return fail(fmt.Errorf("record: %w", err))
		}
		return res, nil
	}
	if d.Bus == spec.BusSATA {
		return fail(errors.New("a SATA disk cannot be hot-plugged (QEMU's AHCI has no hotplug): use bus \"scsi\" or \"virtio\", or attach it while the VM is stopped"))
	}
	probe := d // logs in as QEMU will; the recorded disk stays as given
	probe.InitiatorName = d.InitiatorFor(app.UUID)
	if err := t.Check(ctx, probe); err != nil {
		return fail(err)
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	bus, err := devices.FreeRootPort(ctx, c, vm, app.HotplugPorts)
	if err != nil {
		return fail(err)
	}
	res.Bus = bus
	if d.Type != spec.DiskBlock {
		if err := s.reachable(d.File, d.Backing); err != nil {
			return fail(err)
		}
	}
	intent := newDiskIntent(d, bus)
	intent.FromFile = fromFile
	op, err := s.beginOp(ctx, name, opDiskAttach, intent)
	if err != nil {
		return fail(err)
	}
	defer op.End() // done or undone here; a kill leaves it to recover
	a := &diskAttach{s: s, name: name, d: d, c: c, bus: bus, op: op, fromFile: fromFile}
	undo, err := runSteps(ctx, name, a.hostSteps(), op.After())
	if err != nil {
		return fail(stepCause(err))
	}
	parts, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: a.image, SecretFile: a.prep.SecretFile, UUID: app.UUID}, bus)
	if err != nil {
		undo(ctx)
		return fail(err)
	}
	// Plugged part by part, each undone if a later one fails; last, the
	// record, so that the record and the VM agree.
	plug := append(devices.PlugDisk(c, d.Name, parts, s.opts.UnplugTimeout), step{Name: fmt.Sprintf("disk %q: record", d.Name), Do: func(context.Context) error {
		if err := recordDisk(app, AttachedDisk{Disk: d, Bus: bus, FDSet: a.fdset}, fromFile); err != nil {
			return err
		}
		if err := s.state.RewriteApplied(app); err != nil {
			return fmt.Errorf("record: %w", err)
		}
		return nil
	}})
	if _, err := runSteps(ctx, name, plug, op.After()); err != nil {
		undo(ctx)
		return fail(stepCause(err))
	}
	return res, nil
}

// reachable checks that a running VM can open new files at paths: its
// unit's mount namespace was fixed at start and sees only the image
// directories (bound then) among new files, not /tmp or /home.
func (s *Supervisor) reachable(paths ...string) error {
	if path := s.unreachable(paths...); path != "" {
		return fmt.Errorf("%s is outside the image directories (%s), the only places a running VM can open new images; move it there, or add the disk to the VM's file and restart",
			path, strings.Join(s.opts.ImageDirs, ", "))
	}
	return nil
}

// unreachable is the first of paths a running VM cannot open (reachable),
// "" when it can open them all.
func (s *Supervisor) unreachable(paths ...string) string {
	for _, path := range paths {
		if path == "" {
			continue
		}
		if in, err := s.confiner().InImageDirs(path); err != nil || !in {
			return path
		}
	}
	return ""
}

// diskAttach is the host side of one disk hot-plug: what boot does for a
// disk (storage.Prepare, the confinement's grants), plus handing a block
// device to QEMU as a descriptor.
type diskAttach struct {
	s     *Supervisor
	name  string
	d     spec.Disk
	c     *qmp.Conn
	bus   string
	op    *operation.Op
	prep  storage.Prepared
	image string
	fdset *int64
	rules []units.PathRule
	// fromFile: the disk is the VM's file's (apply).
	fromFile bool
}

func (a *diskAttach) hostSteps() []step {
	d := a.d
	steps := []step{{Name: fmt.Sprintf("disk %q: prepare", d.Name), Do: func(ctx context.Context) (err error) {
		a.prep, err = a.s.tools().Prepare(ctx, d, a.s.paths(a.name).Dir)
		a.image = a.prep.Image
		return err
	}, Undo: func(context.Context) { a.prep.Undo() }}}
	if d.Type == spec.DiskBlock {
		steps = append(steps, step{Name: fmt.Sprintf("disk %q: add-fd", d.Name), Do: func(ctx context.Context) error {
			id, err := devices.PassBlockDevice(ctx, a.c, d)
			if err != nil {
				return err
			}
			a.fdset, a.image = &id, fmt.Sprintf("/dev/fdset/%d", id)
			return nil
		}, Undo: func(ctx context.Context) { _ = a.c.RemoveFD(ctx, *a.fdset, nil) }})
	}
	// The unprivileged QEMU (and its AppArmor profile) must be able to open
	// the disk's files before blockdev-add: the image and its chain, and a
	// secret file made by Prepare.
	return append(steps, step{Name: fmt.Sprintf("disk %q: confine", d.Name), Do: func(ctx context.Context) (err error) {
		if a.rules, err = confine.DiskRules(ctx, d); err != nil {
			return err
		}
		if a.prep.SecretFile != "" {
			a.rules = append(a.rules, units.PathRule{Path: a.prep.SecretFile, Mode: "r"})
		}
		// Journaled before the grants, so that a kill between them leaves
		// nothing unknown.
		in := newDiskIntent(d, a.bus)
		in.FromFile = a.fromFile
		in.Rules = rulePaths(a.rules)
		if err := a.op.SetIntent(in); err != nil {
			return err
		}
		return a.s.ConfinePaths(ctx, a.name, a.rules...)
	}, Undo: func(ctx context.Context) { _ = a.s.ReleasePaths(ctx, a.name, rulePaths(a.rules)...) }})
}

// DetachDisk hot-unplugs a disk attached with AttachDisk: device_del, wait
// for DEVICE_DELETED, then blockdev-del of its nodes and object-del of its
// objects. A guest that does not release the device within
// Options.UnplugTimeout leaves the disk attached and gets an error saying
// so; a later DetachDisk finishes the job once the guest let go.
func (s *Supervisor) DetachDisk(ctx context.Context, name, disk string) error {
	return s.detachDisk(ctx, name, disk, false)
}

// detachDisk is DetachDisk; fromFile: a disk of the VM's file that the
// file no longer has (apply), unplugged from the running VM.
func (s *Supervisor) detachDisk(ctx context.Context, name, disk string, fromFile bool) error {
	fail := func(err error) error { return fmt.Errorf("vm %q: detach disk %q: %w", name, disk, err) }
	lk, err := s.lock(ctx, name, "disk-detach")
	if err != nil {
		return err
	}
	defer lk.Unlock()
	v, err := s.view(name)
	if err != nil && !errors.Is(err, ErrNotRunning) {
		return fail(err)
	}
	app, vd := v.Applied, v.Disk(disk)
	if fromFile {
		if err != nil {
			return fail(err)
		}
		if vd == nil || vd.Attached {
			return fail(errors.New("the VM does not run with it"))
		}
		if err := s.unplugDisk(ctx, name, app, AttachedDisk{Disk: vd.Disk}); err != nil {
			return fail(err)
		}
		return nil
	}
	if v.Tree.HasDisk(disk) {
		return fail(errors.New("it is in the VM's snapshots: remove them first (vmsup snapshot rm)"))
	}
	i := slices.IndexFunc(app.Attached, func(a AttachedDisk) bool { return a.Disk.Name == disk })
	if i < 0 {
		if vd != nil {
			return fail(errors.New("it is in the VM's file; remove it there and restart the VM"))
		}
		return fail(errors.New("no such attached disk"))
	}
	if err != nil { // shut off: only the record
		if err := s.forgetDisk(name, app, disk); err != nil {
			return fail(err)
		}
		return nil
	}
	// Running: plugged in now, or at boot (its own root port either way).
	if err := s.unplugDisk(ctx, name, app, app.Attached[i]); err != nil {
		return fail(err)
	}
	return nil
}

// forgetDisk drops a disk from the record and its secret copy.
func (s *Supervisor) forgetDisk(name string, app *vmstate.Applied, disk string) error {
	if err := dropDisk(app, disk); err != nil {
		return err
	}
	if err := s.state.RewriteApplied(app); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	return storage.RemoveSecret(s.paths(name).Dir, disk)
}

// unplugDisk takes an attached disk out of the running VM, journaled:
// device_del and the wait for the guest, its nodes and objects, its fd set,
// its grants, then the record.
func (s *Supervisor) unplugDisk(ctx context.Context, name string, app *vmstate.Applied, a AttachedDisk) error {
	in := newDiskIntent(a.Disk, a.Bus)
	rules, _ := confine.DiskRules(ctx, a.Disk)
	in.Rules = rulePaths(rules)
	if _, sec := storage.HostFiles(s.paths(name).Dir, a.Disk); sec != "" {
		in.Rules = append(in.Rules, sec)
	}
	op, err := s.beginOp(ctx, name, opDiskDetach, in)
	if err != nil {
		return err
	}
	defer op.End()
	img, sec := storage.HostFiles(s.paths(name).Dir, a.Disk)
	parts, err := qemuargs.Disk(a.Disk, qemuargs.DiskHost{Image: img, SecretFile: sec}, a.Bus)
	if err != nil {
		return err
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return err
	}
	if parts, err = devices.MovedParts(ctx, c, s.paths(name).Dir, a.Disk, parts); err != nil {
		release()
		return err
	}
	err = devices.UnplugDisk(ctx, c, parts, s.opts.UnplugTimeout)
	if err == nil && a.FDSet == nil && a.Disk.Type == spec.DiskBlock {
		// Plugged by apply: its fd set is known to QEMU by its note.
		var pr devices.Present
		if pr, err = devices.Query(ctx, c); err == nil {
			if id, ok := pr.FDSets[devices.FDOpaque(a.Disk.Name)]; ok {
				a.FDSet = &id
			}
		}
	}
	if err == nil && a.FDSet != nil {
		err = c.RemoveFD(ctx, *a.FDSet, nil)
	}
	release()
	if err != nil {
		return err
	}
	op.Step(stepUnplugged("disk", a.Disk.Name))
	// Shrink the confinement again (ConfinePaths in AttachDisk).
	if err := s.ReleasePaths(ctx, name, in.Rules...); err != nil {
		return err
	}
	op.Step(stepReleased("disk", a.Disk.Name))
	return s.forgetDisk(name, app, a.Disk.Name)
}
