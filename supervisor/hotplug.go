package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"
	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// DefaultUnplugTimeout is how long DetachDisk waits for the guest to
// release a disk (DEVICE_DELETED) before it gives up and leaves the disk
// attached (Options.UnplugTimeout).
const DefaultUnplugTimeout = 20 * time.Second

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
	res := AttachResult{VM: name, Disk: d.Name}
	fail := func(err error) (AttachResult, error) {
		return res, fmt.Errorf("vm %q: attach disk %q: %w", name, d.Name, err)
	}
	lk, err := s.lock(ctx, name, "disk-attach")
	if err != nil {
		return res, err
	}
	defer lk.unlock()
	app, vm, err := s.runningSpec(name)
	stopped := errors.Is(err, ErrNotRunning)
	if err != nil && !stopped {
		return fail(err)
	}
	if err := spec.ValidName(d.Name); err != nil {
		return fail(err)
	}
	for _, b := range vm.Disks {
		if b.Name == d.Name {
			return fail(fmt.Errorf("the VM already has a disk named %q", d.Name))
		}
	}
	for _, a := range app.Attached {
		if a.Disk.Name == d.Name {
			return fail(fmt.Errorf("the VM already has a disk named %q (attached)", d.Name))
		}
	}
	t := s.tools()
	if stopped {
		// Nothing to plug: record it, and the next up boots with it.
		if err := t.Check(ctx, d); err != nil {
			return fail(err)
		}
		app.Attached = append(app.Attached, AttachedDisk{Disk: d})
		if err := s.rewriteApplied(app); err != nil {
			return fail(fmt.Errorf("record: %w", err))
		}
		return res, nil
	}
	if err := t.Check(ctx, d); err != nil {
		return fail(err)
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	bus, err := freeRootPort(ctx, c, vm, app)
	if err != nil {
		return fail(err)
	}
	res.Bus = bus
	// The running unit's mount namespace was fixed at start: it sees only
	// the image directories (bound then) among new files, not /tmp or /home.
	for _, path := range []string{d.File, d.Backing} {
		if path == "" || d.Type == spec.DiskBlock {
			continue
		}
		if in, err := s.inImageDirs(path); err != nil || !in {
			return fail(fmt.Errorf("%s is outside the image directories (%s), the only places a running VM can open new images; move it there, or add the disk to the VM's file and restart",
				path, strings.Join(s.opts.ImageDirs, ", ")))
		}
	}
	p := s.paths(name)
	prep, err := t.Prepare(ctx, d, p.Dir)
	if err != nil {
		return fail(err)
	}
	undo, image := prep.Undo, prep.Image
	var fdset *int64
	if d.Type == spec.DiskBlock {
		id, err := passBlockDevice(ctx, c, d)
		if err != nil {
			undo()
			return fail(err)
		}
		fdset, image = &id, fmt.Sprintf("/dev/fdset/%d", id)
		undo = func() { _ = c.RemoveFD(context.WithoutCancel(ctx), id, nil); prep.Undo() }
	}
	parts, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: image, SecretFile: prep.SecretFile}, bus)
	if err != nil {
		undo()
		return fail(err)
	}
	// The unprivileged QEMU (and its AppArmor profile) must be able to open
	// the disk's files before blockdev-add: the image and its chain, and a
	// secret file made by Prepare.
	rules, err := diskRules(ctx, d)
	if err != nil {
		undo()
		return fail(err)
	}
	if prep.SecretFile != "" {
		rules = append(rules, units.PathRule{Path: prep.SecretFile, Mode: "r"})
	}
	if err := s.ConfinePaths(ctx, name, rules...); err != nil {
		undo()
		return fail(err)
	}
	unconfine := func() {
		paths := make([]string, len(rules))
		for i, r := range rules {
			paths[i] = r.Path
		}
		_ = s.ReleasePaths(context.WithoutCancel(ctx), name, paths...)
	}
	if err := plugDisk(ctx, c, parts, s.opts.UnplugTimeout); err != nil {
		unconfine()
		undo()
		return fail(err)
	}
	app.Attached = append(app.Attached, AttachedDisk{Disk: d, Bus: bus, FDSet: fdset})
	if err := s.rewriteApplied(app); err != nil {
		// QEMU has the disk but vmsup could not record it: take it out again
		// so the record and the VM agree.
		_ = unplugDisk(ctx, c, parts, s.opts.UnplugTimeout)
		unconfine()
		undo()
		return fail(fmt.Errorf("record: %w", err))
	}
	return res, nil
}

// DetachDisk hot-unplugs a disk attached with AttachDisk: device_del, wait
// for DEVICE_DELETED, then blockdev-del of its nodes and object-del of its
// objects. A guest that does not release the device within
// Options.UnplugTimeout leaves the disk attached and gets an error saying
// so; a later DetachDisk finishes the job once the guest let go.
func (s *Supervisor) DetachDisk(ctx context.Context, name, disk string) error {
	fail := func(err error) error { return fmt.Errorf("vm %q: detach disk %q: %w", name, disk, err) }
	lk, err := s.lock(ctx, name, "disk-detach")
	if err != nil {
		return err
	}
	defer lk.unlock()
	app, vm, err := s.runningSpec(name)
	if err != nil && !errors.Is(err, ErrNotRunning) {
		return fail(err)
	}
	i := slices.IndexFunc(app.Attached, func(a AttachedDisk) bool { return a.Disk.Name == disk })
	if i < 0 {
		if vm != nil && slices.ContainsFunc(vm.Disks, func(d spec.Disk) bool { return d.Name == disk }) {
			return fail(errors.New("it is in the VM's file; remove it there and restart the VM"))
		}
		return fail(errors.New("no such attached disk"))
	}
	a := app.Attached[i]
	p := s.paths(name)
	if err == nil { // running: plugged in now, or at boot (its own root port either way)
		img, sec := storage.HostFiles(p.Dir, a.Disk)
		parts, err := qemuargs.Disk(a.Disk, qemuargs.DiskHost{Image: img, SecretFile: sec}, a.Bus)
		if err != nil {
			return fail(err)
		}
		c, release, err := s.qmpSession(ctx, name)
		if err != nil {
			return fail(err)
		}
		err = unplugDisk(ctx, c, parts, s.opts.UnplugTimeout)
		if err == nil && a.FDSet != nil {
			err = c.RemoveFD(ctx, *a.FDSet, nil)
		}
		release()
		if err != nil {
			return fail(err)
		}
		// Shrink the confinement again (ConfinePaths in AttachDisk).
		rules, _ := diskRules(ctx, a.Disk)
		paths := []string{}
		for _, r := range rules {
			paths = append(paths, r.Path)
		}
		if sec != "" {
			paths = append(paths, sec)
		}
		if err := s.ReleasePaths(ctx, name, paths...); err != nil {
			return fail(err)
		}
	}
	app.Attached = slices.Delete(app.Attached, i, i+1)
	if err := s.rewriteApplied(app); err != nil {
		return fail(fmt.Errorf("record: %w", err))
	}
	return errors.Join(storage.RemoveSecret(p.Dir, disk))
}

// runningSpec returns the applied state and the VM as it was started. The
// error wraps ErrNotRunning when no QEMU runs (app is still returned).
func (s *Supervisor) runningSpec(name string) (*applied, *spec.VM, error) {
	app, err := s.readApplied(name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, ErrNotFound
		}
		return nil, nil, err
	}
	var vm spec.VM
	if err := json.Unmarshal(app.Spec, &vm); err != nil {
		return app, nil, fmt.Errorf("%s: %w", s.paths(name).State, err)
	}
	if _, err := os.Stat(s.paths(name).QMP); err != nil {
		return app, &vm, ErrNotRunning
	}
	return app, &vm, nil
}

// plugDisk adds the parts in order; on failure it removes what it added.
func plugDisk(ctx context.Context, c *qmp.Conn, p qemuargs.DiskParts, unplugTimeout time.Duration) error {
	var undo []func(context.Context)
	rollback := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i](uctx)
		}
	}
	for _, o := range p.Objects {
		if err := c.ObjectAdd(ctx, o); err != nil {
			rollback()
			return fmt.Errorf("object-add %s: %w", o.ID, err)
		}
		id := o.ID
		undo = append(undo, func(ctx context.Context) { _ = c.ObjectDel(ctx, id) })
	}
	for _, b := range p.Blockdevs {
		if err := c.BlockdevAdd(ctx, b); err != nil {
			rollback()
			return fmt.Errorf("blockdev-add %s: %w", b.NodeName, err)
		}
		node := b.NodeName
		undo = append(undo, func(ctx context.Context) { _ = c.BlockdevDel(ctx, node) })
	}
	for i, d := range p.Devices {
		if err := c.DeviceAdd(ctx, d); err != nil {
			rollback()
			return fmt.Errorf("device_add %s: %w", d.ID, err)
		}
		if i == 0 { // removing the PCI device removes what sits on it
			dev := d.ID
			undo = append(undo, func(ctx context.Context) { _ = unplugDevice(ctx, c, dev, unplugTimeout) })
		}
	}
	return nil
}

// unplugDisk removes the parts: the PCI device (and what sits on it), then
// the nodes, top first, then the objects.
func unplugDisk(ctx context.Context, c *qmp.Conn, p qemuargs.DiskParts, timeout time.Duration) error {
	if len(p.Devices) > 0 {
		if err := unplugDevice(ctx, c, p.Devices[0].ID, timeout); err != nil {
			return err
		}
	}
	var errs []error
	for i := len(p.Blockdevs) - 1; i >= 0; i-- {
		if err := c.BlockdevDel(ctx, p.Blockdevs[i].NodeName); err != nil {
			errs = append(errs, fmt.Errorf("blockdev-del %s: %w", p.Blockdevs[i].NodeName, err))
		}
	}
	for i := len(p.Objects) - 1; i >= 0; i-- {
		if err := c.ObjectDel(ctx, p.Objects[i].ID); err != nil {
			errs = append(errs, fmt.Errorf("object-del %s: %w", p.Objects[i].ID, err))
		}
	}
	return errors.Join(errs...)
}

// unplugDevice asks the guest to release device id and waits for
// DEVICE_DELETED.
func unplugDevice(ctx context.Context, c *qmp.Conn, id string, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sub, unsub := c.Subscribe(wctx)
	defer unsub()
	if err := c.DeviceDel(ctx, id); err != nil {
		if qmp.IsClass(err, qmp.ClassDeviceNotFound) {
			// Already gone: a guest that released it after an earlier
			// detach timed out.
			return nil
		}
		return fmt.Errorf("device_del %s: %w", id, err)
	}
	_, err := qmp.WaitEvent(wctx, sub, "DEVICE_DELETED", func(ev goqmp.Event) bool {
		dev, _ := ev.Data["device"].(string)
		return dev == id
	})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("the guest did not release device %s within %s (does its OS support PCIe hot-unplug, "+
				"and is the disk unmounted?); the disk stays attached", id, timeout)
		}
		return fmt.Errorf("device %s: %w", id, err)
	}
	return nil
}

// rewriteApplied stores a changed applied record beside the unchanged spec
// copy.
func (s *Supervisor) rewriteApplied(app *applied) error {
	raw, err := os.ReadFile(s.paths(app.Name).Spec)
	if err != nil {
		return err
	}
	return s.writeApplied(app, raw)
}

// passBlockDevice opens a block device for QEMU and hands it over (add-fd):
// the running unit may open only the devices it started with (DeviceAllow=
// and PrivateDevices= are fixed at start), and a descriptor is not opened
// again, so QEMU uses /dev/fdset/N instead of the path (as Incus does).
// vmsup's own copy is closed once QEMU holds one.
func passBlockDevice(ctx context.Context, c *qmp.Conn, d spec.Disk) (int64, error) {
	flags := os.O_RDWR
	if d.ReadOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(d.File, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s for QEMU: %w", d.File, err)
	}
	defer f.Close()
	info, err := c.AddFD(ctx, nil, "vmsup disk "+d.Name, f)
	if err != nil {
		return 0, fmt.Errorf("pass %s to QEMU (add-fd): %w", d.File, err)
	}
	return info.FDSetID, nil
}
