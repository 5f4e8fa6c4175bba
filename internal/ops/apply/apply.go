package apply

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Each live change is its own journaled operation (the hot-plugs, a
// resize, or a setting's opApplySet), so an apply killed between two of
// them leaves a record that says what QEMU has, and the next plan and
// apply go on from there.

// Options say what apply does with the changes it cannot make live.
type Options struct {
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
	// Waiting, when set, is told what a restart's health gate waits for
	// while it waits (in process only: the API's caller is not told).
	Waiting GateWaiting `json:"-"`
}

// Result is what Apply did to one VM.
type Result struct {
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
func (a *Applier) Apply(ctx context.Context, f *spec.File, o Options) (Result, error) {
	name := f.VM.Name
	res := Result{VM: name, Applied: []plan.Change{}}
	if o.Restart && o.AtNextReboot {
		return res, errors.New("apply: give --restart or --at-next-reboot, not both")
	}
	// The VM's lock, across the plan and every change: another command
	// (a disk move, a snapshot, a second apply) waits or is refused as
	// busy, never runs between two of apply's changes.
	lk, err := a.lock(ctx, name, "apply")
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	ctx = operation.Holding(ctx, name)
	pr, err := a.Plan(ctx, f, PlanOptions{Adopt: o.Adopt})
	if err != nil {
		return res, err
	}
	if !pr.Running {
		return res, vmerr.Wrap(name, fmt.Errorf("apply %s: %s", f.Path, pr.Note))
	}
	if b := plan.Blocking(pr.Changes); len(b) > 0 {
		lines := make([]string, len(b))
		for i, c := range b {
			lines[i] = fmt.Sprintf("%s: %s", c.Field, c.Why)
		}
		return res, vmerr.Wrap(name, fmt.Errorf("%s cannot be applied, nothing was changed: %s", f.Path, strings.Join(lines, "; ")))
	}
	if o.Adopt {
		if err := a.env.Adopt(ctx, f); err != nil {
			return res, err
		}
	}
	live := plan.Only(pr.Changes, plan.Live)
	var notes []string
	for i, c := range live {
		note, err := a.applyLive(ctx, f, c)
		if err != nil {
			return res, vmerr.Wrap(name, applyStopped(res.Applied, live[i:], err))
		}
		res.Applied, notes = append(res.Applied, c), append(notes, note)
	}
	res.Note = joinNotes(notes...)
	if len(res.Applied) > 0 {
		a.env.Lifecycle(name, EventApplied, map[string]any{"file": absPath(f.Path), "applied": fieldsOf(res.Applied)})
	}
	rest := slices.DeleteFunc(slices.Clone(pr.Changes), func(c plan.Change) bool { return c.Class == plan.Live })
	if len(rest) == 0 {
		return res, a.recordInSync(ctx, f)
	}
	return a.leave(ctx, f, rest, o, res)
}

// deferral is what apply does with the changes it cannot make live.
type deferral int

const (
	deferRestart deferral = iota // a health-gated restart now
	deferReboot                  // the guest's next reboot
	deferPending                 // recorded, for a later restart
)

// deferralOf: a restart when asked for; the next reboot when asked for or
// when none of rest needs a restart; else pending.
func deferralOf(rest []plan.Change, o Options) deferral {
	switch {
	case o.Restart:
		return deferRestart
	case o.AtNextReboot || !slices.ContainsFunc(rest, func(c plan.Change) bool { return c.Class == plan.Restart }):
		return deferReboot
	}
	return deferPending
}

// leave leaves rest, the changes apply cannot make live, as o says.
func (a *Applier) leave(ctx context.Context, f *spec.File, rest []plan.Change, o Options, res Result) (Result, error) {
	res.Pending = rest
	switch deferralOf(rest, o) {
	case deferRestart:
		restarted, err := a.restart(ctx, f, o.Waiting)
		res.Restarted = err == nil && restarted
		if err != nil {
			return res, err
		}
		res.Pending = nil
	case deferReboot:
		if err := a.armReboot(ctx, f, rest); err != nil {
			return res, err
		}
		res.AtReboot = true
		res.Note = joinNotes(res.Note, fmt.Sprintf("%d change(s) apply when the guest next reboots itself (or by vmsup reboot --mode agent %s)", len(rest), f.VM.Name))
	default:
		if err := a.writePending(f, rest, false); err != nil {
			return res, err
		}
		res.Note = joinNotes(res.Note, fmt.Sprintf("%d change(s) need a restart: vmsup apply --restart %s (now, health-gated) or --at-next-reboot", len(rest), f.Path))
	}
	return res, nil
}

// applyStopped says what an apply that failed part-way did.
func applyStopped(done, left []plan.Change, err error) error {
	fields := func(cs []plan.Change) string {
		if len(cs) == 0 {
			return "nothing"
		}
		return strings.Join(fieldsOf(cs), ", ")
	}
	return fmt.Errorf("apply stopped at %s: %w; applied before it: %s; not applied: %s (vmsup plan shows what is left)",
		left[0].Field, err, fields(done), fields(left))
}

// applyLive makes one live change, through the operation that owns it; the
// note says what it did in the guest (vCPUs and memory onlined).
func (a *Applier) applyLive(ctx context.Context, f *spec.File, c plan.Change) (note string, err error) {
	name, vm := f.VM.Name, &f.VM
	switch c.Kind {
	case plan.DiskAdd:
		_, err = a.hotplug().AttachDisk(ctx, name, *findDisk(vm, c.Name), true)
	case plan.DiskRemove:
		err = a.hotplug().DetachDisk(ctx, name, c.Name, true)
	case plan.NICAdd:
		_, err = a.hotplug().AttachNIC(ctx, name, *findNIC(vm, c.Name), true)
	case plan.NICRemove:
		err = a.hotplug().DetachNIC(ctx, name, c.Name, true)
	case plan.CPUs:
		_, note, err = a.resize(ctx, name, ResizeOptions{CPUs: vm.CPUs})
	case plan.Memory:
		_, note, err = a.resize(ctx, name, ResizeOptions{Memory: vm.Memory})
	default:
		err = a.setLive(ctx, f, c)
	}
	return note, err
}

// recordInSync records f as what the VM runs, once every change is in:
// the spec copy becomes the file, and nothing is pending. The vCPUs and
// memory stay recorded as booted plus resized (what a migration needs).
func (a *Applier) recordInSync(ctx context.Context, f *spec.File) error {
	name := f.VM.Name
	lk, err := a.lock(ctx, name, "apply")
	if err != nil {
		return err
	}
	defer lk.Unlock()
	st := a.state()
	app, err := st.ReadApplied(name)
	if err != nil {
		return vmerr.Wrap(name, err)
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
	if err := st.WriteApplied(app, f.Raw); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("record: %w", err))
	}
	return st.ClearPending(name)
}

// writePending records the changes left for later.
func (a *Applier) writePending(f *spec.File, rest []plan.Change, atReboot bool) error {
	pd := &vmstore.Pending{SourceFile: absPath(f.Path), Raw: f.Raw, AtReboot: atReboot, Since: time.Now().UTC()}
	for _, c := range rest {
		pd.Changes = append(pd.Changes, c.String())
	}
	if err := a.state().WritePending(f.VM.Name, pd); err != nil {
		return vmerr.Wrap(f.VM.Name, fmt.Errorf("record the pending changes: %w", err))
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
