package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// PlanResult is what Plan found for one VM.
type PlanResult struct {
	VM      string `json:"name"`
	File    string `json:"file"`
	Running bool   `json:"running"`
	// InSync: the VM runs exactly its file (it runs, and no change).
	InSync bool `json:"in_sync"`
	// Changes, removals and additions first; empty when the VM runs its
	// file.
	Changes []plan.Change `json:"changes"`
	// Pending is what an earlier apply left for a restart or the guest's
	// next reboot.
	Pending *vmstore.Pending `json:"pending,omitempty"`
	// Kept are disks and NICs attached by hand, which apply leaves alone.
	Kept []string `json:"kept,omitempty"`
	Note string   `json:"note,omitempty"`
}

// PlanOptions change what Plan does.
type PlanOptions struct {
	// Adopt plans f for its VM although the VM belongs to another file
	// (what apply --adopt would do); without it that is an OwnerError.
	Adopt bool
}

// Plan compares f with its running VM and says what apply would do. It
// takes no lock: an operation a killed command left is settled only when
// no other command holds the VM's lock (Apply settled it when it took it).
func (a *Applier) Plan(ctx context.Context, f *spec.File, o PlanOptions) (PlanResult, error) {
	if err := a.env.ValidateContext(ctx, f); err != nil {
		return PlanResult{VM: f.VM.Name, File: f.Path}, err
	}
	if err := a.env.CheckOwner(f, o.Adopt); err != nil {
		return PlanResult{VM: f.VM.Name, File: f.Path}, err
	}
	if _, err := a.k.SettleIfFree(ctx, f.VM.Name); err != nil {
		return PlanResult{VM: f.VM.Name, File: f.Path}, err
	}
	return a.plan(ctx, f)
}

func (a *Applier) plan(ctx context.Context, f *spec.File) (PlanResult, error) {
	name := f.VM.Name
	res := PlanResult{VM: name, File: absPath(f.Path), Changes: []plan.Change{}}
	v, err := a.env.View(name)
	switch {
	case errors.Is(err, vmstore.ErrNotFound), errors.Is(err, vmstore.ErrNotRunning):
		res.Note = "not running: vmsup up " + f.Path + " starts it from its file"
		return res, nil
	case err != nil:
		return res, vmerr.Wrap(name, err)
	}
	res.Running = true
	app, running := v.Applied, v.Spec
	facts := plan.Facts{BootMemory: v.Booted.Memory, NotLive: a.notLive(f, v), TapsNotLive: a.hotplug().TapRefusal(name),
		Snapshotted: a.snapshotted(name, f.VM.Disks)}
	for _, d := range v.Disks {
		if d.Attached {
			facts.KeptDisks = append(facts.KeptDisks, d.Name)
			res.Kept = append(res.Kept, "disk "+d.Name)
		}
	}
	for _, n := range v.NICs {
		if n.Attached {
			facts.KeptNICs = append(facts.KeptNICs, n.Name)
			res.Kept = append(res.Kept, "nic "+n.Name)
		}
	}
	c, release, err := a.unit.QMPSession(ctx, name)
	if err != nil {
		return res, err
	}
	free, ferr := qdev.FreeRootPorts(ctx, c, running, app.HotplugPorts)
	release()
	if ferr == nil {
		facts.SpareSlots = len(free)
		if !running.Q35() {
			facts.SpareSlots = 32 // pci.0 takes hotplugs itself; QEMU says when it is full
		}
	}
	running = vmstore.AsMoved(running, app.Moved, &f.VM)
	identity.KeepUUID(running, &f.VM, app.UUID)
	identity.KeepMachine(running, &f.VM, app.Machine)
	res.Changes = plan.Diff(running, &f.VM, facts)
	if res.Pending, err = a.state().ReadPending(name); err != nil {
		return res, err
	}
	if len(res.Changes) == 0 {
		res.Pending = nil // a pending record the VM has caught up with
		res.InSync = true
	}
	return res, nil
}

// snapshotted are the VM's disks in snapshots, each with why it cannot
// grow: plan classes their growth by it and the resize refuses by it.
func (a *Applier) snapshotted(vm string, disks []spec.Disk) map[string]string {
	path := a.paths(vm).Snapshots()
	tree, err := snapshottree.Load(path)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, d := range disks {
		if tree.HasDisk(d.Name) {
			out[d.Name] = fmt.Sprintf("the disk is in snapshots (%s): its file is a snapshot's frozen image; grow it after removing them", path)
		}
	}
	return out
}

// notLive finds the disks new in f that the running VM could not open
// (the check a disk's attach makes): apply adds them by a restart.
func (a *Applier) notLive(f *spec.File, v *vmstore.View) map[string]string {
	out := map[string]string{}
	for _, d := range f.VM.Disks {
		if v.Disk(d.Name) != nil || d.Type == spec.DiskBlock {
			continue
		}
		if path := a.env.Unreachable(d.File, d.Backing); path != "" {
			out[d.Name] = fmt.Sprintf("%s is outside the image directories (%s), which a running VM cannot open: the disk is added by a restart (vmsup apply --restart)",
				path, strings.Join(a.env.Opts().ImageDirs, ", "))
		}
	}
	return out
}
