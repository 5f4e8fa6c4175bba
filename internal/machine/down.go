package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// StopStep says what ended a VM on Down.
type StopStep string

// Stop steps, in the order Down tries them.
const (
	StoppedAlready StopStep = "already-off" // nothing was running
	StoppedACPI    StopStep = "acpi"        // the guest powered off after an ACPI powerdown
	StoppedAgent   StopStep = "agent"       // the guest powered off after qemu-ga's guest-shutdown
	StoppedQuit    StopStep = "quit"        // QMP quit after the stop timeout
	StoppedKill    StopStep = "kill"        // SIGKILL after quit did not end QEMU
	// StoppedNotCurrent: the stop hook of a unit that is not the VM's
	// current QEMU left the guest alone (systemd signals its own QEMU).
	StoppedNotCurrent StopStep = "not-current"
)

// DownResult reports a Down.
type DownResult struct {
	VM       string
	Step     StopStep
	Duration time.Duration
	Note     string // e.g. "was crashed: killed by signal KILL"
}

// DownOptions change how Down ends a VM.
type DownOptions struct {
	// Timeout is how long the guest gets to power off; 0 means the
	// spec's stop_timeout.
	Timeout time.Duration
	// Force skips the powerdown: QMP quit at once (QEMU flushes its
	// disks and exits), SIGKILL if it does not.
	Force bool
	// Kill sends SIGKILL at once: no grace, no flush.
	Kill bool
	// Waiting, when set, is called about once a second while the guest is
	// given time to power off, with the time waited and the bound.
	Waiting func(waited, timeout time.Duration)
}

// Down shuts the VM down gracefully: ACPI powerdown over QMP, wait up to the
// spec's stop timeout for QEMU to exit, then QMP quit, then SIGKILL. The unit
// is gone when Down returns; the state directory and applied spec stay.
func (s *Env) Down(ctx context.Context, name string) (DownResult, error) {
	return s.DownWith(ctx, name, DownOptions{})
}

// DownWith is Down with options: another timeout, quit or kill at once.
func (s *Env) DownWith(ctx context.Context, name string, o DownOptions) (DownResult, error) {
	res := DownResult{VM: name}
	if err := spec.ValidName(name); err != nil {
		return res, vmerr.Wrap(name, err)
	}
	lu, err := s.LockUnit(ctx, name, "down")
	if err != nil {
		return res, err
	}
	defer lu.unlock()
	return s.DownLocked(ctx, name, lu, o)
}

// DownLocked is Down under the VM's lock (lu).
func (s *Env) DownLocked(ctx context.Context, name string, lu *LockedUnit, o DownOptions) (DownResult, error) {
	res := DownResult{VM: name, Note: lu.note}
	start := time.Now()
	sd, unit, st := lu.sd, lu.unit, lu.st
	var err error
	if st.Gone() {
		if st.ActiveState == "failed" {
			res.Note = strings.TrimPrefix(res.Note+"; was crashed: "+st.ExitReason(), "; ")
			if err := sd.ResetFailed(ctx, unit); err != nil {
				return res, err
			}
		}
		if _, err := os.Stat(s.Paths(name).Dir); err != nil && !st.Exists {
			return res, s.NotFound(name)
		}
		res.Step = StoppedAlready
		return res, s.AfterStop(ctx, name)
	}
	if !o.Kill {
		res.Step, err = s.gracefulStop(ctx, name, o)
		if err != nil && ctx.Err() != nil {
			// Interrupted (Ctrl-C): nothing more is done to the VM.
			res.Step = ""
			return res, s.interruptedDown(ctx, name, lu, err)
		}
	}
	if err != nil || res.Step == "" {
		s.opts.Logger.Warn("graceful stop failed, killing", "vm", name, "err", err)
		res.Step = StoppedKill
		// The mark tells the stop-post hook this SIGKILL was vmsup's.
		mark := s.Paths(name).KillMark()
		_ = os.WriteFile(mark, nil, 0o600)
		if err := sd.Kill(ctx, unit, syscall.SIGKILL); err != nil {
			os.Remove(mark) // nothing was killed
			return res, vmerr.Wrap(name, fmt.Errorf("kill: %w", err))
		}
	}
	kctx, cancel := context.WithTimeout(ctx, killTimeout)
	defer cancel()
	if err := sd.WaitStopped(kctx, unit); err != nil {
		return res, vmerr.Wrap(name, fmt.Errorf("unit did not go away: %w", err))
	}
	res.Duration = time.Since(start)
	return res, s.AfterStop(ctx, name)
}

// AfterStop cleans up after a QEMU that is gone: stale sockets and what the
// host steps set up.
func (s *Env) AfterStop(ctx context.Context, name string) error {
	if err := s.Paths(name).RemoveSockets(); err != nil {
		return vmerr.Wrap(name, err)
	}
	if err := s.hostTeardown(ctx, name); err != nil {
		return vmerr.Wrap(name, err)
	}
	s.companions().StopLeft(ctx, s.Paths(name), name)
	return nil
}

// ErrNotFound means vmsup knows no VM of that name.
var ErrNotFound = vmstore.ErrNotFound

// ErrInterrupted means a command's context ended (Ctrl-C, SIGTERM) before
// it was done; its error says in what state it left the VM. The error
// also matches the context's own (context.Canceled, ...).
var ErrInterrupted = errors.New("interrupted")

// interruptedError is ErrInterrupted with the state left and the cause.
type interruptedError struct {
	msg   string
	cause error
}

func (e *interruptedError) Error() string   { return "interrupted: " + e.msg }
func (e *interruptedError) Unwrap() []error { return []error{ErrInterrupted, e.cause} }

// stopAsked is gracefulStop's error when its context ended first: what it
// had asked of the VM by then ("" for nothing).
type stopAsked struct {
	asked string
	err   error
}

func (e *stopAsked) Error() string { return e.err.Error() }
func (e *stopAsked) Unwrap() error { return e.err }

// interruptedDown is the error of a down whose context ended while it
// waited (err): it says whether the VM still runs and what it had been
// asked; nothing was killed.
func (s *Env) interruptedDown(ctx context.Context, name string, lu *LockedUnit, err error) error {
	asked := "nothing was asked of it"
	var sa *stopAsked
	if errors.As(err, &sa) && sa.asked != "" {
		asked = sa.asked
	}
	state := "still running"
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if st, serr := lu.sd.Status(sctx, lu.unit); serr == nil && st.Gone() {
		state = "no longer running (it ended meanwhile)"
	}
	return vmerr.Wrap(name, &interruptedError{msg: fmt.Sprintf("it is %s (%s; nothing was killed)", state, asked), cause: ctx.Err()})
}

// stopSettings are the VM's stop_timeout and shutdown method, from the spec
// it runs with (defaults if that cannot be read).
func (s *Env) stopSettings(name string) (time.Duration, string) {
	if f, err := spec.Load(s.Paths(name).Spec); err == nil {
		return f.VM.StopTimeout.D(), f.VM.Shutdown
	}
	return spec.DefaultStopTimeout, spec.ShutdownACPI
}

// gracefulStop is the shared graceful path of Down and of the unit's
// ExecStop= hook: powerdown (ACPI or the guest agent), wait up to the VM's
// stop_timeout for QEMU to go, then quit. It returns "" when QEMU is still
// there afterwards.
func (s *Env) gracefulStop(ctx context.Context, name string, o DownOptions) (StopStep, error) {
	timeout, method := s.stopSettings(name)
	if o.Timeout > 0 {
		timeout = o.Timeout
	}
	c, release, err := s.QMPSession(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	if qs, err := c.QueryStatus(ctx); err == nil && (qs.Status == qmp.RunGuestPanicked || qs.Status == qmp.RunPrelaunch) {
		// A panicked guest cannot act on a powerdown, and one whose start
		// died before it ran (prelaunch: we hold the lock) never will:
		// waiting would only cost stop_timeout.
		o.Force = true
	}
	if !o.Force {
		step, asked := StoppedACPI, "its guest was asked to power off"
		if method == spec.ShutdownAgent && s.agentShutdown(ctx, name, c, "powerdown") {
			step, asked = StoppedAgent, "its guest agent was asked to shut the guest down"
		} else if err := c.SystemPowerdown(ctx); err != nil && !errors.Is(err, qmp.ErrClosed) {
			return "", err
		}
		done, err := waitGone(ctx, c.Done(), timeout, o.Waiting)
		if err != nil {
			return "", &stopAsked{asked: asked, err: err}
		}
		if done {
			return step, nil
		}
	}
	qctx, cancel := context.WithTimeout(ctx, quitTimeout)
	defer cancel()
	_ = c.Quit(qctx) // the reply may be lost as QEMU exits
	select {
	case <-c.Done():
		return StoppedQuit, nil
	case <-qctx.Done():
		if ctx.Err() != nil {
			return "", &stopAsked{asked: "QEMU was asked to quit", err: ctx.Err()}
		}
		return "", fmt.Errorf("QEMU ignored quit")
	}
}

// waitGone waits up to timeout for gone to close, calling waiting each second.
func waitGone(ctx context.Context, gone <-chan struct{}, timeout time.Duration, waiting func(waited, timeout time.Duration)) (bool, error) {
	start := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-gone:
			return true, nil
		case <-deadline.C:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		case <-tick.C:
			if waiting != nil {
				waiting(time.Since(start), timeout)
			}
		}
	}
}

// isCurrentUnit reports whether unit runs the VM's QEMU (as recorded).
func (s *Env) isCurrentUnit(name, unit string) bool {
	return unit == "" || unit == s.state.UnitOf(name)
}

// StopHook is what the unit's ExecStop= runs (as "vmsup stop-hook --unit
// UNIT NAME"): on "systemctl stop" or host shutdown it gives the guest the
// same graceful powerdown as Down. systemd also runs it after QEMU exited by
// itself ($MAINPID unset); then it returns at once. It acts only if unit is
// the VM's current QEMU: the hook of another (an orphan migration
// destination) must never power off the live guest; systemd then stops
// that QEMU by signal. An empty unit (a unit started by an older vmsup)
// is taken as current.
func (s *Env) StopHook(ctx context.Context, name, unit string) (StopStep, error) {
	if os.Getenv("MAINPID") == "" {
		return StoppedAlready, nil
	}
	if !s.isCurrentUnit(name, unit) {
		return StoppedNotCurrent, nil
	}
	step, err := s.gracefulStop(ctx, name, DownOptions{})
	if err != nil {
		return step, vmerr.Wrap(name, fmt.Errorf("stop hook: %w (systemd will signal QEMU)", err))
	}
	return step, nil
}
