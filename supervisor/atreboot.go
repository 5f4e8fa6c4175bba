package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// Changes at the guest's next reboot, with no resident process: apply
// (internal/ops/apply) records them as pending and tells QEMU to exit instead
// of resetting when the guest reboots. Here is the rest: the unit's
// stop-post hook finds the guest's reset as the reason in QEMU's event log
// and starts a guardian unit, which waits for the old unit to end and
// starts the VM from the pending file (apply's RebootFile), health-gated,
// the previous spec coming back on failure; a restart policy's guardian is
// the same. A guest that powers off stays off (its file applies at up).

// HookRebootApply is the guardian's hook command.
const HookRebootApply = "reboot-apply"

// rebootUnit is the guardian's unit.
func rebootUnit(name string) string { return "vmsup-" + name + "@reboot.service" }

// afterGuestReboot is the stop-post hook's last part: when the unit's QEMU
// ended because the guest rebooted (the last SHUTDOWN of its event log,
// shutdown), it starts the guardian that brings the VM back. It reports
// whether it did.
func (s *Supervisor) afterGuestReboot(ctx context.Context, name string, shutdown *eventlog.Record) (bool, error) {
	if s.opts.Self == "" || shutdown == nil || shutdown.Reason() != "guest-reset" {
		return false, nil
	}
	if err := s.startGuardian(ctx, name, "start "+name+" again after its guest rebooted"); err != nil {
		return false, vmerr.Wrap(name, fmt.Errorf("the guest rebooted, but its guardian did not start: %w (vmsup up starts it)", err))
	}
	return true, nil
}

// rebootWait bounds the guardian's wait for the old unit to end.
const rebootWait = 5 * time.Minute

// RebootApply is the guardian's work: once the old unit is gone, start the
// VM from its pending file (or, with none, the spec it ran), health-gated.
func (s *Supervisor) RebootApply(ctx context.Context, name string) (string, error) {
	if err := spec.ValidName(name); err != nil {
		return "", vmerr.Wrap(name, err)
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, rebootWait)
	sd.WaitGone(wctx, s.state.UnitOf(name))
	cancel()
	lu, err := s.lockUnit(ctx, name, "reboot-apply")
	if err != nil {
		return "", err
	}
	defer lu.unlock()
	if !lu.st.Gone() {
		return "it runs again already", nil
	}
	old, err := s.appliedFile(name)
	if err != nil {
		return "", vmerr.Wrap(name, err)
	}
	f, note := s.applier().RebootFile(ctx, name, old)
	op, err := s.ops.Begin(ctx, name, opRestart, restartIntent{File: absPath(f.Path), Raw: f.Raw})
	if err != nil {
		return "", vmerr.Wrap(name, err)
	}
	defer op.End()
	op.Step(restartDown)
	if _, err := s.startGated(ctx, sd, f, old, op, false, nil); err != nil {
		return "", vmerr.Wrap(name, err)
	}
	return joinNote(note, "started from "+f.Path), nil
}
