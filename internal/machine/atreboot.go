package machine

import (
	"context"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// HookRebootApply is the guardian's hook command.
const HookRebootApply = "reboot-apply"

// rebootUnit is the guardian's unit.
func rebootUnit(name string) string { return "vmsup-" + name + "@reboot.service" }

// afterGuestReboot is the stop-post hook's last part: when the unit's QEMU
// ended because the guest rebooted (the last SHUTDOWN of its event log,
// shutdown), it starts the guardian that brings the VM back. It reports
// whether it did.
func (s *Env) afterGuestReboot(ctx context.Context, name string, shutdown *eventlog.Record) (bool, error) {
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
// VM from the file pick gives (apply's pending file, or with none the spec
// it ran), health-gated.
func (s *Env) RebootApply(ctx context.Context, name string, pick func(context.Context, string, *spec.File) (*spec.File, string)) (string, error) {
	if err := spec.ValidName(name); err != nil {
		return "", vmerr.Wrap(name, err)
	}
	sd, err := s.Systemd(ctx)
	if err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, rebootWait)
	sd.WaitGone(wctx, s.state.UnitOf(name))
	cancel()
	lu, err := s.LockUnit(ctx, name, "reboot-apply")
	if err != nil {
		return "", err
	}
	defer lu.unlock()
	if !lu.st.Gone() {
		return "it runs again already", nil
	}
	old, err := s.AppliedFile(name)
	if err != nil {
		return "", vmerr.Wrap(name, err)
	}
	f, note := pick(ctx, name, old)
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
