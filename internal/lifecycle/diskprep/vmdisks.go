// Package vmdisks is the host side of a VM's disks around its start: the
// check of every disk before anything starts (as the VM will open it,
// with one error per disk placed at its key), the disks a start boots
// with beyond its file (carried, moved), the storage step that prepares
// them (images created, seeds built, secrets copied into the state
// directory), the unit's access to block devices, the files argv names
// for them, and the teardown once QEMU is gone. The backends themselves
// (qemu-img, iSCSI, RBD, seeds, secrets) are package storage's; which
// image a disk is on is vmstate's and startplan.Boot's rule.
package diskprep

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// Step is the start step that prepares the disks.
const Step = "storage"

// checkTimeout bounds the checks of all of a VM's disks (each qemu-img
// call has its own, shorter bound).
const checkTimeout = 2 * time.Minute

// Manager checks and prepares the disks of the VMs of one state root.
type Manager struct {
	Store vmstore.Store
	Tools storage.Tools
	// CheckPaths checks a disk's host paths against the host's places
	// (internal/host/places), for the disks a start carries from an earlier
	// run: the places may have changed since they were attached.
	CheckPaths func(ctx context.Context, d spec.Disk) error
}

var (
	_ startplan.Contributor = Manager{}
	_ startplan.Reuser      = Manager{}
)

// Check checks every disk of f (and the disks attached to the VM earlier,
// which the next start boots with) before anything is started: one clear
// error per disk naming the file, the disk field and the disk. Disks with
// a problem in the file (f.Broken) or a key outside the host's places
// (refused) are skipped; named says whether the VM's name is sound, to
// look for its running QEMU and its records.
func (m Manager) Check(ctx context.Context, f *spec.File, named bool, refused []string) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	running := false
	uuid := f.VM.UUID // the UUID the VM logs in to iSCSI targets with, when known
	boot := startplan.Boot{Tree: &snapshottree.Tree{}}
	if named {
		p := m.Store.Paths(f.VM.Name)
		_, qmpErr := os.Stat(p.QMP)
		running = qmpErr == nil
		if app, err := m.Store.ReadApplied(f.VM.Name); err == nil {
			uuid = cmp.Or(uuid, app.UUID)
			boot.Moved = app.Moved
		}
		var err error
		if boot.Tree, err = snapshottree.Load(p.Snapshots()); err != nil {
			return f.Errorf("disk", "%v", err)
		}
	}
	// Checked as the VM will open them: moved, on their snapshot overlays.
	disks := make([]spec.Disk, len(f.VM.Disks))
	for i, od := range boot.Disks(&f.VM) {
		disks[i] = od.Opened()
	}
	var errs []error
	ok := map[int]bool{}
	for i, d := range disks {
		disk := fmt.Sprintf("disk[%d]", i)
		if f.Broken(disk) || slices.ContainsFunc(refused, func(r string) bool { return strings.HasPrefix(r, disk+".") }) {
			continue
		}
		d.InitiatorName = d.InitiatorFor(uuid)
		err := m.Tools.Check(ctx, d)
		if errors.Is(err, storage.ErrInUse) && running {
			// The VM runs and holds its own images; up leaves it alone.
			err = nil
		}
		if errors.Is(err, storage.ErrInUse) {
			err = m.heldBy(f.VM.Name, d, err)
		}
		if err != nil {
			errs = append(errs, fieldError(f, i, err))
			continue
		}
		ok[i] = true
	}
	uses := hostUses(ctx, disks, ok)
	errs = append(errs, checkSharedImages(f, disks, uses)...)
	if named {
		errs = append(errs, m.checkOwners(f, disks, uses)...)
	}
	return f.Join(errs...)
}

// checkSharedImages refuses one host image opened by two of disks where
// either writes it (QEMU's write lock would refuse the second at start),
// as the file's own check does with the paths as written: here the host
// objects behind them (hostUses), through symlinks, "..", hard links, two
// /dev names of one block device, and the bases of an existing image's
// backing chain.
func checkSharedImages(f *spec.File, disks []spec.Disk, uses []spec.ImageUse) []error {
	if len(uses) < 2 {
		return nil
	}
	return f.SharedImages(disks, uses)
}

// SamePath reports whether a and b name one file (through symlinks, or
// two names of one device).
func SamePath(a, b string) bool {
	if a == b {
		return true
	}
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// heldBy names the VM vmsup knows whose QEMU holds the image of d (err is
// the lock's error): "in use by VM "web" (its disk "data")".
func (m Manager) heldBy(self string, d spec.Disk, err error) error {
	names, _ := m.Store.Known()
	for _, n := range names {
		if n == self {
			continue
		}
		v, verr := m.Store.View(n)
		if verr != nil || !v.Running {
			continue
		}
		for _, od := range v.Disks {
			if slices.ContainsFunc(od.Images(v.Tree), func(p string) bool { return SamePath(p, d.File) }) {
				return &storage.Error{Disk: d.Name, Field: "file", Err: storage.ErrInUse,
					Msg: fmt.Sprintf("%s: %v: VM %q has it open (its disk %q)", d.File, storage.ErrInUse, n, od.Name)}
			}
		}
	}
	return err
}

// fieldError places a storage error at the disk's key in f:
// `web.toml:9:1: disk[1].backing: disk "data": base image /b.qcow2: no such file`.
func fieldError(f *spec.File, i int, err error) error {
	field := fmt.Sprintf("disk[%d]", i)
	var se *storage.Error
	if errors.As(err, &se) && se.Field != "" {
		field += "." + se.Field
	}
	return f.Errorf(field, "%v", err)
}

// Carried are the disks hot-plugged during an earlier run that the next
// start of f's VM boots with, as recorded in its applied state.
func (m Manager) Carried(f *spec.File) ([]spec.Disk, error) {
	app, err := m.Store.ReadApplied(f.VM.Name)
	if err != nil {
		return nil, nil // never started: nothing attached
	}
	names := map[string]bool{}
	for _, d := range f.VM.Disks {
		names[d.Name] = true
	}
	var out []spec.Disk
	for _, a := range app.Attached {
		if names[a.Disk.Name] {
			return nil, f.Errorf("disk", "disk %q was attached to VM %q with `vmsup disk attach` and the file now has a disk of that name too; "+
				"detach it (vmsup disk detach %s %s) or rename one", a.Disk.Name, f.VM.Name, f.VM.Name, a.Disk.Name)
		}
		out = append(out, a.Disk)
	}
	return out, nil
}

// MovedFor keeps the disk moves recorded for f's VM that still apply: a
// file that names another source for the disk than the one it was moved
// from (the user edited it, to the new place or elsewhere) wins.
func MovedFor(f *spec.File, moved map[string]vmstore.MovedDisk) map[string]vmstore.MovedDisk {
	out := map[string]vmstore.MovedDisk{}
	for _, d := range f.VM.Disks {
		if mv, ok := moved[d.Name]; ok && mv.From == vmstore.DiskSource(d) {
			out[d.Name] = mv
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Steps is the storage step: the disks the start boots with prepared
// (images created on demand, seeds built, secrets copied into the state
// directory), undone on a failed start. The unit may open their block
// devices.
func (m Manager) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	var prepared []storage.Prepared
	plan.AddUnit(func(u *units.Unit) { blockDevices(u, &plan.Boot.File(f).VM) })
	return []steps.Step{{
		Name: Step,
		Do: func(ctx context.Context) error {
			for i, d := range plan.Boot.File(f).VM.Disks {
				if i >= len(f.VM.Disks) {
					// Attached earlier: checked at attach time, but the host
					// (and its places) may have changed since.
					if err := m.CheckPaths(ctx, d); err != nil {
						return fmt.Errorf("attached disk %q (vmsup disk attach): %w", d.Name, err)
					}
					if err := m.Tools.Check(ctx, d); err != nil {
						return fmt.Errorf("attached disk (vmsup disk attach): %w", err)
					}
				}
				pr, err := m.Tools.Prepare(ctx, d, plan.Paths.Dir)
				if err != nil {
					if i < len(f.VM.Disks) {
						return fieldError(f, i, err)
					}
					return err
				}
				prepared = append(prepared, pr)
				if pr.NewImage != "" { // (rm --delete-disks may delete it)
					if err := plan.Paths.NoteMade(pr.NewImage); err != nil {
						return err
					}
				}
				// The objects again, as they are now (validate's were
				// closed, a name may lead elsewhere since) and a new
				// image with its chain; confinement grants the ones it
				// opens itself.
				if err := m.checkObjects(ctx, f, d); err != nil {
					return err
				}
			}
			return nil
		},
		Undo: func(context.Context) {
			for i := len(prepared) - 1; i >= 0; i-- {
				prepared[i].Undo()
			}
			prepared = nil
		},
	}}
}

// checkObjects is CheckPaths on a disk about to boot: one line naming the
// VM, the disk and the file.
func (m Manager) checkObjects(ctx context.Context, f *spec.File, d spec.Disk) error {
	if m.CheckPaths == nil || d.Type != spec.DiskFile {
		return nil
	}
	if err := m.CheckPaths(ctx, d); err != nil {
		return fmt.Errorf("vm %q: disk %q: %w", f.VM.Name, d.Name, err)
	}
	return nil
}

// Reuse: a local migration's new QEMU opens the file's block devices too.
func (m Manager) Reuse(f *spec.File, plan *startplan.Plan) error {
	plan.AddUnit(func(u *units.Unit) { blockDevices(u, &f.VM) })
	return nil
}

// blockDevices opens the unit's closed device policy to the block devices
// of the VM's disks (/dev/kvm is added with the unit).
func blockDevices(u *units.Unit, vm *spec.VM) {
	for _, d := range vm.Disks {
		if d.Type != spec.DiskBlock {
			continue
		}
		access := "rw"
		if d.ReadOnly {
			access = "r"
		}
		path := d.File
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real
		}
		u.DeviceAllow = append(u.DeviceAllow, units.DeviceRule{Path: path, Access: access})
	}
}

// HostFiles names the files the storage step prepares for vm's disks in
// the state directory dir; argv uses them whether or not they exist yet
// (vmsup argv).
func HostFiles(dir string, vm *spec.VM) map[string]qemuargs.DiskHost {
	out := map[string]qemuargs.DiskHost{}
	for _, d := range vm.Disks {
		img, sec := storage.HostFiles(dir, d)
		if img != "" || sec != "" {
			out[d.Name] = qemuargs.DiskHost{Image: img, SecretFile: sec}
		}
	}
	return out
}

// Teardown undoes the storage step once QEMU is gone: the copied secrets
// in the state directory dir go (QEMU read them when it started). Images
// and seeds stay. Idempotent.
func Teardown(dir string) error {
	if err := storage.Teardown(dir); err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	return nil
}

// Record notes in the applied state which disks the VM boots with beyond
// its file (carried, now boot-time disks) and which root ports stay free
// for hotplug.
func Record(a *vmstore.Applied, boot *spec.VM, carried []spec.Disk) {
	a.Attached = nil
	for _, d := range carried {
		a.Attached = append(a.Attached, vmstore.AttachedDisk{Disk: d})
	}
	a.HotplugPorts = qemuargs.SpareRootPorts(boot)
}
