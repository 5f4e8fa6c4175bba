package apply

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Changes at the guest's next reboot, with no resident process: apply
// records them (Pending) and tells QEMU to exit instead of resetting when
// the guest reboots (set-action reboot=shutdown). The unit's stop-post hook
// then finds the guest's reset as the reason in QEMU's event log and starts
// a guardian (machine.Env.RebootApply), which waits for the old unit to end and starts
// the VM from the pending file (RebootFile), health-gated, the previous
// spec coming back on failure. A guest that powers off stays off (its file
// applies at up).

// armReboot records rest for the guest's next reboot and makes QEMU exit
// then. Pending first: a QEMU told to exit on reboot with nothing pending
// still comes back (with its own spec), never stays down.
func (a *Applier) armReboot(ctx context.Context, f *spec.File, rest []plan.Change) error {
	name := f.VM.Name
	app, err := a.state().ReadApplied(name)
	if err != nil {
		return vmerr.Wrap(name, err)
	}
	if app.EventLog == "" {
		return vmerr.Wrap(name, errors.New("its QEMU keeps no event log (it was started by a migration or an older vmsup), "+
			"so its reboot cannot be told from a poweroff: vmsup apply --restart applies the changes now"))
	}
	if err := a.writePending(f, rest, true); err != nil {
		return err
	}
	c, release, err := a.unit.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if err := c.SetAction(ctx, qmp.Actions{Reboot: "shutdown"}); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("set-action reboot=shutdown: %w", err))
	}
	return nil
}

// RebootFile is the file the VM starts from once its guest rebooted: the
// one pending for the reboot if it still applies here, else old (the spec
// it ran); note says which and why.
func (a *Applier) RebootFile(ctx context.Context, name string, old *spec.File) (f *spec.File, note string) {
	pd, err := a.state().ReadPending(name)
	if err != nil || pd == nil || !pd.AtReboot {
		return old, "nothing pending"
	}
	f, err = spec.Parse(pd.SourceFile, pd.Raw)
	if err == nil {
		err = a.env.ValidateContext(ctx, f)
	}
	if err != nil {
		return old, fmt.Sprintf("the pending file no longer applies (%v): started with the spec it ran", err)
	}
	return f, "applied the changes pending since " + pd.Since.Format(time.RFC3339)
}
