package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/qmp"
)

// opReboot is an ACPI reboot in the journal: QEMU was told to pause, not
// exit, when the guest powers off.
const opReboot operation.Kind = "reboot"

// RebootMode chooses how Reboot asks the guest.
type RebootMode string

// Reboot modes.
const (
	RebootAuto  RebootMode = ""      // the guest agent if it answers, else ACPI
	RebootAgent RebootMode = "agent" // the guest agent only
	RebootACPI  RebootMode = "acpi"  // the power button, with QEMU told to reset instead of exiting
)

// RebootResult says how a guest was rebooted.
type RebootResult struct {
	VM  string
	Via string // "agent" or "acpi"
}

// Reboot asks the guest to reboot while QEMU keeps running: through the
// guest agent (guest-shutdown reboot) when it answers, else by ACPI: QEMU is
// told to pause instead of exiting when the guest powers off, the power
// button pressed, and once the guest is down the machine is reset and
// resumed (libvirt's "fake reboot"). A reboot cut short by a killed vmsup
// is finished by the guardian, so a later guest poweroff is never left
// paused.
func (s *Env) Reboot(ctx context.Context, name string, mode RebootMode) (RebootResult, error) {
	res := RebootResult{VM: name}
	switch mode {
	case RebootAuto, RebootAgent, RebootACPI:
	default:
		return res, vmerr.Wrap(name, fmt.Errorf("reboot: unknown mode %q (want %q, %q or %q)", mode, RebootAuto, RebootAgent, RebootACPI))
	}
	lk, err := s.Lock(ctx, name, "reboot")
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	c, release, err := s.QMPSession(ctx, name)
	if err != nil {
		return res, err
	}
	if qs, err := c.QueryStatus(ctx); err != nil || !qs.Running {
		release()
		if err == nil {
			err = fmt.Errorf("QEMU is %s: resume it first (or reset it)", qs.Status)
		}
		return res, vmerr.Wrap(name, fmt.Errorf("reboot: %w", err))
	}
	if mode != RebootACPI && s.agentShutdown(ctx, name, c, "reboot") {
		release()
		res.Via = "agent"
		return res, nil
	}
	release()
	if mode == RebootAgent {
		return res, vmerr.Wrap(name, errors.New("reboot: the guest agent does not answer"))
	}
	res.Via = "acpi"
	timeout, _ := s.stopSettings(name)
	op, stop, err := s.beginGuardedOp(ctx, name, opReboot, nil)
	if err != nil {
		return res, vmerr.Wrap(name, err)
	}
	defer stop()
	if err := s.acpiReboot(ctx, name, timeout, op.After()); err != nil {
		return res, vmerr.Wrap(name, fmt.Errorf("reboot: %w", err))
	}
	return res, vmerr.Wrap(name, op.End())
}

// Reboot steps (in the journal).
const (
	rebootPause   operation.Step = "reboot-pause-on-poweroff"
	rebootPressed operation.Step = "reboot-powerdown"
	rebootReset   operation.Step = "reboot-reset"
)

// acpiReboot runs the steps of an ACPI reboot; finish does the same from any
// of them, so it serves as the recovery too.
func (s *Env) acpiReboot(ctx context.Context, name string, timeout time.Duration, after func(vm, step string)) error {
	c, release, err := s.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if err := c.SetAction(ctx, qmp.Actions{Shutdown: "pause"}); err != nil {
		return err
	}
	after(name, string(rebootPause))
	events, stopEvents := c.Subscribe(ctx)
	defer stopEvents()
	if err := c.SystemPowerdown(ctx); err != nil {
		return errors.Join(err, restoreShutdown(ctx, c))
	}
	after(name, string(rebootPressed))
	return s.finishReboot(ctx, c, events, timeout, after, name)
}

// finishReboot waits up to timeout for the guest to power off (QEMU then
// pauses in state "shutdown"), resets and resumes it, and gives QEMU back
// its poweroff action. A guest that ignores the button keeps running; a
// status query that times out is no reason to leave a guest powered off.
func (s *Env) finishReboot(ctx context.Context, c *qmp.Conn, events <-chan goqmp.Event, timeout time.Duration, after func(vm, step string), name string) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for down := false; !down; {
		qs, err := c.QueryStatus(ctx) // one that times out is asked again: a guest shutting down under TCG can keep QEMU busy
		if err != nil && (!errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil) {
			return err
		}
		if qs.Status == qmp.RunShutdown {
			break
		}
		if resetNotResumed(qs.Status) {
			return errors.Join(c.Cont(ctx), restoreShutdown(ctx, c))
		}
		select {
		case ev, ok := <-events:
			if !ok {
				events = nil // closed with the connection: poll the status
			}
			down = ev.Event == "SHUTDOWN"
		case <-time.After(200 * time.Millisecond): // events may be missed across a recovery
		case <-deadline.C:
			if err := restoreShutdown(ctx, c); err != nil {
				return err
			}
			return fmt.Errorf("%w within %s; it runs on", errNoPoweroff, timeout)
		case <-ctx.Done():
			return errors.Join(ctx.Err(), restoreShutdown(context.WithoutCancel(ctx), c))
		}
	}
	if err := c.SystemReset(ctx); err != nil {
		return err
	}
	after(name, string(rebootReset))
	if err := c.Cont(ctx); err != nil {
		return err
	}
	return restoreShutdown(ctx, c)
}

// errNoPoweroff: the guest ignored the power button for the stop timeout.
var errNoPoweroff = errors.New("the guest did not power off")

func restoreShutdown(ctx context.Context, c *qmp.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, quitTimeout)
	defer cancel()
	return c.SetAction(ctx, qmp.Actions{Shutdown: "poweroff"})
}

// recoverReboot finishes a reboot whose command died: the guest may be
// shutting down, stopped after its poweroff ("shutdown"), or reset but not
// resumed ("prelaunch": QEMU's state after a reset from "shutdown").
func (s *Env) recoverReboot(ctx context.Context, name string, op *operation.Op) (string, error) {
	c, release, err := s.QMPSession(ctx, name)
	if errors.Is(err, ErrNotRunning) {
		return "QEMU is gone", nil
	}
	if err != nil {
		return "", err
	}
	defer release()
	qs, err := c.QueryStatus(ctx)
	if err != nil {
		return "", err
	}
	switch {
	case op.Has(rebootReset) || resetNotResumed(qs.Status):
		if err := c.Cont(ctx); err != nil {
			return "", err
		}
		return "resumed the reset guest", restoreShutdown(ctx, c)
	case !op.Has(rebootPause):
		return "nothing was done", restoreShutdown(ctx, c)
	case qs.Status == qmp.RunShutdown:
		if err := c.SystemReset(ctx); err != nil {
			return "", err
		}
		if err := c.Cont(ctx); err != nil {
			return "", err
		}
		return "finished the reboot", restoreShutdown(ctx, c)
	}
	// Still running: the guest may be shutting down. Press only if the
	// killed command had not: a second press can outlive the reset and
	// power the rebooted guest off for good (seen in TestFaultsHotplug).
	events, stop := c.Subscribe(ctx)
	defer stop()
	if !op.Has(rebootPressed) {
		if err := c.SystemPowerdown(ctx); err != nil {
			return "", errors.Join(err, restoreShutdown(ctx, c))
		}
	}
	timeout, _ := s.stopSettings(name)
	err = s.finishReboot(ctx, c, events, timeout, func(string, string) {}, name)
	if errors.Is(err, errNoPoweroff) {
		// Settled all the same: QEMU powers off again on a poweroff, and the
		// guest runs; only the reboot did not happen.
		return "the reboot did not happen (" + err.Error() + "); QEMU's poweroff action is given back", nil
	}
	if err != nil {
		return "", err
	}
	return "finished the reboot", nil
}

// resetNotResumed: QEMU stopped after a reset from "shutdown" (a reboot's
// reset done, its resume not).
func resetNotResumed(status qmp.RunState) bool { return status == qmp.RunPrelaunch }

// Reset is a hard reset (QMP system_reset): the guest restarts at once,
// without shutting down; QEMU keeps running.
func (s *Env) Reset(ctx context.Context, name string) error {
	lk, err := s.Lock(ctx, name, "reset")
	if err != nil {
		return err
	}
	defer lk.Unlock()
	c, release, err := s.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if err := c.SystemReset(ctx); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("reset: %w", err))
	}
	return nil
}

// Kill ends the VM's QEMU at once with SIGKILL: no shutdown, no flush of
// QEMU's caches. The unit is gone when it returns.
func (s *Env) Kill(ctx context.Context, name string) (DownResult, error) {
	return s.DownWith(ctx, name, DownOptions{Kill: true})
}
