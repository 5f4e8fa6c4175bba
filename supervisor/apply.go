package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/devices"
	"github.com/vmsup/vmsup/internal/identity"
	"github.com/vmsup/vmsup/internal/plan"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
)

// Plan and apply: the VM's file is compared with the VM as it runs
// (internal/plan), and each difference is applied the cheapest way QEMU
// allows: live, at the guest's next reboot, or by a health-gated restart.
// Each live change is its own journaled operation (the hot-plugs, set, or
// opApplySet), so apply killed between two of them leaves a record that
// says what QEMU has, and the next plan and apply go on from there.

// PlanResult is what Plan found for one VM.
type PlanResult struct {
	VM      string `json:"vm"`
	File    string `json:"file"`
	Running bool   `json:"running"`
	// Changes, removals and additions first; empty when the VM runs its
	// file.
	Changes []plan.Change `json:"changes"`
	// Pending is what an earlier apply left for a restart or the guest's
	// next reboot.
	Pending *vmstate.Pending `json:"pending,omitempty"`
	// Kept are disks and NICs attached by hand, which apply leaves alone.
	Kept []string `json:"kept,omitempty"`
	Note string   `json:"note,omitempty"`
}

// InSync reports whether the VM runs exactly its file.
func (p PlanResult) InSync() bool { return p.Running && len(p.Changes) == 0 }

// Plan compares f with its running VM and says what apply would do.
func (s *Supervisor) Plan(ctx context.Context, f *spec.File) (PlanResult, error) {
	return s.PlanWith(ctx, f, PlanOptions{})
}

// PlanOptions change what PlanWith does.
type PlanOptions struct {
	// Adopt plans f for its VM although the VM belongs to another file
	// (what apply --adopt would do); without it that is an OwnerError.
	Adopt bool
}

// PlanWith is Plan with options.
func (s *Supervisor) PlanWith(ctx context.Context, f *spec.File, o PlanOptions) (PlanResult, error) {
	if err := s.ValidateContext(ctx, f); err != nil {
		return PlanResult{VM: f.VM.Name, File: f.Path}, err
	}
	if err := s.checkOwner(f, o.Adopt); err != nil {
		return PlanResult{VM: f.VM.Name, File: f.Path}, err
	}
	if _, err := s.recoverUnlocked(ctx, f.VM.Name); err != nil {
		return PlanResult{VM: f.VM.Name, File: f.Path}, err
	}
	return s.plan(ctx, f)
}

func (s *Supervisor) plan(ctx context.Context, f *spec.File) (PlanResult, error) {
	name := f.VM.Name
	res := PlanResult{VM: name, File: absPath(f.Path), Changes: []plan.Change{}}
	v, err := s.view(name)
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrNotRunning):
		res.Note = "not running: vmsup up " + f.Path + " starts it from its file"
		return res, nil
	case err != nil:
		return res, vmErr(name, err)
	}
	res.Running = true
	app, running := v.Applied, v.Spec
	facts := plan.Facts{BootMemory: v.Booted.Memory, NotLive: s.notLive(f, v)}
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
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return res, err
	}
	free, ferr := devices.FreeRootPorts(ctx, c, running, app.HotplugPorts)
	release()
	if ferr == nil {
		facts.SpareSlots = len(free)
		if running.Machine == "pc" {
			facts.SpareSlots = 32 // pci.0 takes hotplugs itself; QEMU says when it is full
		}
	}
	identity.KeepUUID(running, &f.VM, app.UUID)
	res.Changes = plan.Diff(running, &f.VM, facts)
	if res.Pending, err = s.state.ReadPending(name); err != nil {
		return res, err
	}
	if len(res.Changes) == 0 {
		res.Pending = nil // a pending record the VM has caught up with
	}
	return res, nil
}

// notLive finds the disks new in f that the running VM could not open
// (the check attachDisk makes): apply adds them by a restart.
func (s *Supervisor) notLive(f *spec.File, v *vmstate.View) map[string]string {
	out := map[string]string{}
	for _, d := range f.VM.Disks {
		if v.Disk(d.Name) != nil || d.Type == spec.DiskBlock {
			continue
		}
		if path := s.unreachable(d.File, d.Backing); path != "" {
			out[d.Name] = fmt.Sprintf("%s is outside the image directories (%s), which a running VM cannot open: the disk is added by a restart (vmsup apply --restart)",
				path, strings.Join(s.opts.ImageDirs, ", "))
		}
	}
	return out
}

// ApplyOptions say what apply does with the changes it cannot make live.
type ApplyOptions struct {
	// Restart: restart the VM now for them, health-gated (the VM's
	// [health]); a failing gate brings the previous spec back.
	Restart bool
	// AtNextReboot: apply them when the guest reboots by itself (QEMU is
	// started again with the file then). Changes of class reboot are
	// always deferred so.
	AtNextReboot bool
	// Adopt makes f the file the VM belongs to although it was started
	// from another (without it, an OwnerError).
	Adopt bool
}

// ApplyResult is what Apply did to one VM.
type ApplyResult struct {
	VM      string        `json:"vm"`
	Applied []plan.Change `json:"applied"`
	// Pending are the changes left for a restart or the next reboot.
	Pending   []plan.Change `json:"pending,omitempty"`
	Restarted bool          `json:"restarted,omitempty"`
	AtReboot  bool          `json:"at_reboot,omitempty"`
	Note      string        `json:"note,omitempty"`
}

// Apply makes the running VM match f: the live changes at once, each on its
// own, in plan order; the rest by a restart (o.Restart), at the guest's next
// reboot, or recorded as pending. A change that cannot be applied at all
// makes it refuse the whole file before it does anything. A live change
// that fails stops it: the error says what was applied, and plan then shows
// what is left. Applying a file the VM already runs does nothing.
func (s *Supervisor) Apply(ctx context.Context, f *spec.File, o ApplyOptions) (ApplyResult, error) {
	name := f.VM.Name
	res := ApplyResult{VM: name, Applied: []plan.Change{}}
	if o.Restart && o.AtNextReboot {
		return res, errors.New("apply: give --restart or --at-next-reboot, not both")
	}
	// The VM's lock, across the plan and every change: another command
	// (a disk move, a snapshot, a second apply) waits or is refused as
	// busy, never runs between two of apply's changes.
	lk, err := s.lock(ctx, name, "apply")
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	ctx = holding(ctx, name)
	pr, err := s.PlanWith(ctx, f, PlanOptions{Adopt: o.Adopt})
	if err != nil {
		return res, err
	}
	if !pr.Running {
		return res, vmErr(name, fmt.Errorf("apply %s: %s", f.Path, pr.Note))
	}
	if b := plan.Blocking(pr.Changes); len(b) > 0 {
		lines := make([]string, len(b))
		for i, c := range b {
			lines[i] = fmt.Sprintf("%s: %s", c.Field, c.Why)
		}
		return res, vmErr(name, fmt.Errorf("%s cannot be applied, nothing was changed: %s", f.Path, strings.Join(lines, "; ")))
	}
	if o.Adopt {
		if err := s.adopt(ctx, f); err != nil {
			return res, err
		}
	}
	live := plan.Only(pr.Changes, plan.Live)
	for i, c := range live {
		if err := s.applyLive(ctx, f, c); err != nil {
			return res, vmErr(name, applyStopped(res.Applied, live[i:], err))
		}
		res.Applied = append(res.Applied, c)
	}
	if len(res.Applied) > 0 {
		s.lifecycle(name, EventApplied, map[string]any{"file": absPath(f.Path), "applied": fieldsOf(res.Applied)})
	}
	rest := slices.DeleteFunc(slices.Clone(pr.Changes), func(c plan.Change) bool { return c.Class == plan.Live })
	if len(rest) == 0 {
		return res, s.recordInSync(ctx, f)
	}
	res.Pending = rest
	needRestart := slices.ContainsFunc(rest, func(c plan.Change) bool { return c.Class == plan.Restart })
	switch {
	case o.Restart:
		r, err := s.Restart(ctx, f)
		res.Restarted = err == nil && r.Action == Restarted
		if err != nil {
			return res, err
		}
		res.Pending = nil
	case o.AtNextReboot || !needRestart:
		if err := s.armReboot(ctx, f, rest); err != nil {
			return res, err
		}
		res.AtReboot = true
		res.Note = fmt.Sprintf("%d change(s) apply when the guest next reboots itself (or by vmsup reboot --mode agent %s)", len(rest), name)
	default:
		if err := s.writePending(f, rest, false); err != nil {
			return res, err
		}
		res.Note = fmt.Sprintf("%d change(s) need a restart: vmsup apply --restart %s (now, health-gated) or --at-next-reboot", len(rest), f.Path)
	}
	return res, nil
}

// applyStopped says what an apply that failed part-way did.
func applyStopped(done, left []plan.Change, err error) error {
	fields := func(cs []plan.Change) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Field)
		}
		if len(out) == 0 {
			return "nothing"
		}
		return strings.Join(out, ", ")
	}
	return fmt.Errorf("apply stopped at %s: %w; applied before it: %s; not applied: %s (vmsup plan shows what is left)",
		left[0].Field, err, fields(done), fields(left))
}

// applyLive makes one live change, through the operation that owns it.
func (s *Supervisor) applyLive(ctx context.Context, f *spec.File, c plan.Change) error {
	name, vm := f.VM.Name, &f.VM
	var err error
	switch c.Kind {
	case plan.DiskAdd:
		_, err = s.attachDisk(ctx, name, *findDisk(vm, c.Name), true)
	case plan.DiskRemove:
		err = s.detachDisk(ctx, name, c.Name, true)
	case plan.NICAdd:
		_, err = s.attachNIC(ctx, name, *findNIC(vm, c.Name), true)
	case plan.NICRemove:
		err = s.detachNIC(ctx, name, c.Name, true)
	case plan.CPUs:
		_, err = s.Resize(ctx, name, ResizeOptions{CPUs: vm.CPUs})
	case plan.Memory:
		_, err = s.Resize(ctx, name, ResizeOptions{Memory: vm.Memory})
	default:
		err = s.setLive(ctx, f, c)
	}
	return err
}

// recordInSync records f as what the VM runs, once every change is in:
// the spec copy becomes the file, and nothing is pending. The vCPUs and
// memory stay recorded as booted plus resized (what a migration needs).
func (s *Supervisor) recordInSync(ctx context.Context, f *spec.File) error {
	name := f.VM.Name
	lk, err := s.lock(ctx, name, "apply")
	if err != nil {
		return err
	}
	defer lk.Unlock()
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return vmErr(name, err)
	}
	boot, err := app.VM()
	if err != nil {
		return err
	}
	vm := f.VM
	vm.CPUs, vm.Memory = boot.CPUs, boot.Memory
	app.SetVM(&vm)
	app.SourceFile = absPath(f.Path)
	app.Generation++
	if err := s.state.WriteApplied(app, f.Raw); err != nil {
		return vmErr(name, fmt.Errorf("record: %w", err))
	}
	return s.state.ClearPending(name)
}

// writePending records the changes left for later.
func (s *Supervisor) writePending(f *spec.File, rest []plan.Change, atReboot bool) error {
	pd := &vmstate.Pending{SourceFile: absPath(f.Path), Raw: f.Raw, AtReboot: atReboot, Since: time.Now().UTC()}
	for _, c := range rest {
		pd.Changes = append(pd.Changes, c.String())
	}
	if err := s.state.WritePending(f.VM.Name, pd); err != nil {
		return vmErr(f.VM.Name, fmt.Errorf("record the pending changes: %w", err))
	}
	return nil
}

func fieldsOf(cs []plan.Change) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Field
	}
	return out
}
