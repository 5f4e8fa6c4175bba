package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/livesettings"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// opApplySet journals one live change of a setting (I/O limits, a link, a
// CD-ROM's medium, a disk's size, the unit's limits, what vmsup only
// records): its intent is the change and the spec it comes from. Each
// setting is made so that making it again is harmless, so recovery simply
// makes it again and records it.
const opApplySet operation.Kind = "apply-set"

type setIntent struct {
	Change plan.Change     `json:"change"`
	Want   json.RawMessage `json:"want"` // the file's VM
}

// setLive makes one setting change of f on its running VM, journaled.
func (a *Applier) setLive(ctx context.Context, f *spec.File, c plan.Change) error {
	name := f.VM.Name
	lk, err := a.lock(ctx, name, "apply")
	if err != nil {
		return err
	}
	defer lk.Unlock()
	if c.Kind == plan.DiskMedium {
		if err := a.checkMedium(f, c.Name); err != nil {
			return err
		}
	}
	op, err := a.k.Begin(ctx, name, opApplySet, setIntent{Change: c, Want: vmstore.Canonical(&f.VM)})
	if err != nil {
		return err
	}
	defer op.End()
	return a.makeSetting(ctx, name, &f.VM, c, op.After())
}

// checkMedium: a new CD-ROM image must be where the running VM can open
// new files (its sandbox's image directories).
func (a *Applier) checkMedium(f *spec.File, disk string) error {
	if err := a.env.Reachable(findDisk(&f.VM, disk).File); err != nil {
		return fmt.Errorf("disk %q: %w", disk, err)
	}
	return nil
}

// recoverApplySet settles a setting's change whose command died: with
// QEMU gone there is nothing to set; else the setting is made again.
func (a *Applier) recoverApplySet(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[setIntent](op)
	if err != nil {
		return "", err
	}
	var want spec.VM
	if err := json.Unmarshal(in.Want, &want); err != nil {
		return "", err
	}
	if _, err := a.env.View(name); errors.Is(err, vmstore.ErrNotRunning) {
		return "QEMU is gone: nothing to set", nil
	}
	if err := a.makeSetting(ctx, name, &want, in.Change, func(string, string) {}); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s was set again and recorded", in.Change.Field), nil
}

// makeSetting puts c's setting from want into the running QEMU (or its
// unit), then into the record.
func (a *Applier) makeSetting(ctx context.Context, name string, want *spec.VM, c plan.Change, done func(vm, step string)) error {
	app, err := a.state().ReadApplied(name)
	if err != nil {
		return err
	}
	rec, err := app.VM()
	if err != nil {
		return err
	}
	if err := a.setting(ctx, name, want, rec, c); err != nil {
		return fmt.Errorf("%s: %w", c.Field, err)
	}
	done(name, c.Field)
	if err := a.state().RecordVM(app, rec); err != nil {
		return fmt.Errorf("%s: record: %w", c.Field, err)
	}
	return nil
}

// setting makes one change in QEMU or the unit and in rec (the record's
// VM); it may be run again.
func (a *Applier) setting(ctx context.Context, name string, want, rec *spec.VM, c plan.Change) error {
	switch c.Kind {
	case plan.UnitLimits:
		return a.setUnitLimits(ctx, name, want, rec)
	case plan.Autostart:
		rec.Autostart = want.Autostart
		if want.Autostart {
			f, err := a.env.AppliedSpec(name)
			if err != nil {
				return err
			}
			_, err = a.unit.Enable(ctx, f)
			return err
		}
		return a.unit.Disable(ctx, name)
	case plan.NICFilter:
		rec.SecurityGroups = want.SecurityGroups
		for i := range rec.NICs {
			if w := findNIC(want, rec.NICs[i].Name); w != nil {
				rec.NICs[i].AllowSpoofing, rec.NICs[i].SecurityGroups = w.AllowSpoofing, w.SecurityGroups
			}
		}
		return a.env.Net().SetFilters(ctx, name, rec)
	case plan.RecordOnly:
		rec.Description, rec.Shutdown, rec.Health = want.Description, want.Shutdown, want.Health
		if wd, rd := findDisk(want, c.Name), findDisk(rec, c.Name); wd != nil && rd != nil {
			rd.Size = wd.Size
		}
		return nil
	}
	qc, release, err := a.unit.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	return a.qmpSetting(ctx, name, qc, want, rec, c)
}

// qmpSetting is setting for what QEMU changes.
func (a *Applier) qmpSetting(ctx context.Context, name string, qc *qmp.Conn, want, rec *spec.VM, c plan.Change) error {
	if c.Kind == plan.Balloon {
		if err := livesettings.SetBalloon(ctx, qc, want); err != nil {
			return err
		}
		rec.BalloonTarget = want.BalloonTarget
		return nil
	}
	if c.Kind == plan.Pinning {
		if err := livesettings.Repin(ctx, qc, want, a.paths(name).QMP); err != nil {
			return err
		}
		rec.Pinning.VCPUs = want.Pinning.VCPUs
		return nil
	}
	if c.Kind == plan.NICLink {
		wn, rn := findNIC(want, c.Name), findNIC(rec, c.Name)
		if wn == nil || rn == nil {
			return fmt.Errorf("no nic %q", c.Name)
		}
		if err := livesettings.SetLink(ctx, qc, *wn); err != nil {
			return err
		}
		rn.Link = wn.Link
		return nil
	}
	wd, rd := findDisk(want, c.Name), findDisk(rec, c.Name)
	if wd == nil || rd == nil {
		return fmt.Errorf("no disk %q", c.Name)
	}
	switch c.Kind {
	case plan.DiskLimits:
		if err := livesettings.SetIOLimits(ctx, qc, *wd); err != nil {
			return err
		}
		rd.IOLimits = wd.IOLimits
	case plan.DiskGrow:
		if why, ok := a.snapshotted(name, []spec.Disk{*wd})[c.Name]; ok {
			return fmt.Errorf("disk %q: %s", c.Name, why)
		}
		// The node on top of the device, not the one it booted with: a
		// merge (block-commit) or a move leaves another node there.
		node, err := qdev.DeviceNode(ctx, qc, c.Name)
		if err != nil {
			return err
		}
		if err := qc.BlockResize(ctx, node, int64(wd.Size)); err != nil {
			return fmt.Errorf("block_resize %s: %w", node, err)
		}
		rd.Size = wd.Size
	case plan.DiskMedium:
		if err := a.changeMedium(ctx, name, qc, *rd, *wd); err != nil {
			return err
		}
		rd.File = wd.File
	default:
		return fmt.Errorf("not a live setting (%s)", c.Kind)
	}
	return nil
}

func findNIC(vm *spec.VM, name string) *spec.NIC {
	if i := slices.IndexFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == name }); i >= 0 {
		return &vm.NICs[i]
	}
	return nil
}

func findDisk(vm *spec.VM, name string) *spec.Disk {
	if i := slices.IndexFunc(vm.Disks, func(d spec.Disk) bool { return d.Name == name }); i >= 0 {
		return &vm.Disks[i]
	}
	return nil
}

// changeMedium grants QEMU the new image, swaps the medium, and takes the
// old image's grant back.
func (a *Applier) changeMedium(ctx context.Context, name string, c *qmp.Conn, old, d spec.Disk) error {
	rules, err := confine.DiskRules(ctx, d)
	if err != nil {
		return err
	}
	if err := a.env.ConfinePaths(ctx, name, rules...); err != nil {
		return err
	}
	img, sec := storage.HostFiles(a.paths(name).Dir, d)
	parts, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: img, SecretFile: sec}, "")
	if err != nil {
		return err
	}
	if err := qdev.ChangeMedium(ctx, c, parts); err != nil {
		return err
	}
	if old.File != d.File {
		if oldRules, err := confine.DiskRules(ctx, old); err == nil {
			_ = a.env.ReleasePaths(ctx, name, rulePaths(oldRules)...)
		}
	}
	return nil
}

func rulePaths(rules []units.PathRule) []string {
	paths := make([]string, len(rules))
	for i, r := range rules {
		paths[i] = r.Path
	}
	return paths
}

// setUnitLimits gives the running unit the file's limits.
func (a *Applier) setUnitLimits(ctx context.Context, name string, want, rec *spec.VM) error {
	l := want.Limits
	weight := l.CPUWeight
	if weight == 0 {
		weight = 100 // systemd's and the kernel's default weight
	}
	mem := uint64(rec.MaxMemory + l.MemoryOverhead)
	if err := a.unit.SetUnitLimits(ctx, name, units.Limits{CPUQuota: &l.CPUQuota, CPUWeight: &weight,
		MemoryMax: &mem, TasksMax: &l.TasksMax}); err != nil {
		return err
	}
	rec.Limits = l
	return nil
}
