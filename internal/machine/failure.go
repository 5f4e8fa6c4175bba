package machine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// A guest panic or a QEMU crash, with no resident process: QEMU reports a
// panic through the pvpanic device and, for on_panic "poweroff" and
// "restart", exits (-action panic=shutdown); the unit's stop-post hook then
// finds the reason in QEMU's event log (SHUTDOWN guest-panic) or in what
// systemd tells it (SERVICE_RESULT signal), records it, and for a
// "restart" policy starts the same guardian a reboot-at-apply uses, unless
// the VM used up its restarts (restart_limit within restart_window, counted
// in its history). systemd's own Restart= does not fit: it would run the
// same QEMU argv after ExecStopPost= took the taps and secret copies away;
// a start through vmsup's pipeline makes them again. "pause" and
// "preserve" keep QEMU with the guest stopped (-action panic=pause).

// Lifecycle events of the failure policy.
const (
	EventPanicked     = "panicked"      // the guest's kernel panicked (pvpanic) and QEMU ended
	EventRestarting   = "restarting"    // on_panic/on_crash "restart": a new QEMU starts
	EventRestartLimit = "restart-limit" // ... or not: restart_limit restarts within restart_window
)

// ErrPreserved refuses to resume a guest that on_panic "preserve" keeps.
var ErrPreserved = errors.New(`its guest panicked and on_panic = "preserve" keeps it stopped for inspection (vmsup qmp NAME ...); vmsup down or vmsup restart ends it`)

// endKind is how recordEnd classes the end of a QEMU: the lifecycle event
// and its reason.
func endKind(recs []eventlog.Record, result string) (event, reason string) {
	event = eventlog.Stopped
	if e := eventlog.LastOf(recs, "SHUTDOWN"); e != nil {
		reason = e.Reason()
	}
	switch {
	case reason == "guest-panic":
		event = EventPanicked
	case result == "signal" || result == "core-dump" || result == "exit-code" || result == "watchdog":
		event = eventlog.Crashed
	}
	return event, reason
}

// restartAfter is the stop-post hook's last part for a QEMU that ended by
// a panic or a crash (event): when the VM's policy says restart, and the
// limit allows, the guardian starts it again. It returns the hook's note.
func (s *Env) restartAfter(ctx context.Context, name string, app *vmstore.Applied, event string) (string, error) {
	if app == nil || (event != EventPanicked && event != eventlog.Crashed) {
		return "", nil
	}
	vm, err := app.VM()
	if err != nil {
		return "", vmerr.Wrap(name, err)
	}
	cause := "the guest panicked"
	if event == eventlog.Crashed {
		cause = "QEMU crashed"
	}
	if (event == EventPanicked && vm.OnPanic != spec.PanicRestart) || (event == eventlog.Crashed && vm.OnCrash != spec.CrashRestart) {
		return cause, nil
	}
	window := vm.RestartWindow.D()
	hist := s.Paths(name).EventHistory()
	recent, err := eventlog.History(hist, time.Now().Add(-window))
	if err != nil {
		return cause, vmerr.Wrap(name, err)
	}
	n := 0
	for _, r := range recent {
		if r.Source == eventlog.SourceVmsup && r.Event == EventRestarting {
			n++
		}
	}
	data := map[string]any{"reason": cause, "limit": vm.RestartLimit, "window": window.String()}
	if n >= vm.RestartLimit {
		s.Lifecycle(name, EventRestartLimit, data)
		return fmt.Sprintf("%s; not started again: %d restarts within %s (restart_limit)", cause, n, window), nil
	}
	data["count"] = n + 1
	s.Lifecycle(name, EventRestarting, data)
	if err := s.startGuardian(ctx, name, "start "+name+" again after "+cause); err != nil {
		return cause, vmerr.Wrap(name, fmt.Errorf("%s, but its guardian did not start: %w (vmsup up starts it)", cause, err))
	}
	return fmt.Sprintf("%s: %s starts it again (restart %d of %d within %s)", cause, rebootUnit(name), n+1, vm.RestartLimit, window), nil
}

// startGuardian starts the unit that waits for the VM's unit to end and
// starts the VM again (RebootApply): what a guest reboot at apply and a
// restart policy share.
func (s *Env) startGuardian(ctx context.Context, name, why string) error {
	sd, err := s.Systemd(ctx)
	if err != nil {
		return err
	}
	return sd.Start(ctx, s.guardianUnit(name, why))
}

// guardianUnit is the unit that starts the VM again. It runs as root,
// unconfined, like the vmsup up it stands in for (taps, grants, AppArmor,
// QEMU users, the VM's unit; systemd-analyze security rates it as any root
// service, ~9.6).
func (s *Env) guardianUnit(name, why string) units.Unit {
	argv := append([]string{s.opts.Self, HookRebootApply, "--wait", "--root", s.opts.Root}, s.startFlags()...)
	if s.opts.SystemdBus != "" {
		argv = append(argv, "--systemd-bus", s.opts.SystemdBus)
	}
	return units.Unit{Name: rebootUnit(name), Description: "vmsup: " + why,
		Argv: append(argv, name), Collect: true, DeviceAll: true}
}

// EndedReason is what status says of a shut-off VM whose last lifecycle
// event was a panic, a crash or the restart limit ("" otherwise).
func (s *Env) EndedReason(name string) string {
	r := eventlog.LastVmsup(s.Paths(name).EventHistory())
	if r == nil {
		return ""
	}
	at := r.Time.Local().Format(time.RFC3339)
	switch r.Event {
	case EventPanicked:
		return "the guest panicked at " + at
	case eventlog.Crashed:
		return "QEMU crashed at " + at
	case EventRestartLimit:
		var d struct {
			Reason string `json:"reason"`
			Limit  int    `json:"limit"`
			Window string `json:"window"`
		}
		_ = json.Unmarshal(r.Data, &d)
		return fmt.Sprintf("%s at %s; restart limit reached (%d within %s)", d.Reason, at, d.Limit, d.Window)
	}
	return ""
}
