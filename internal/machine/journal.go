package machine

import (
	"context"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Every command that takes several steps on a VM runs as an operation of
// the kernel (internal/lifecycle/operation): under the VM's lock, its intent and
// each step journaled, so that the next command on the VM finishes or
// undoes what a killed one left, with the recoverer registered for its
// kind (registerRecoverers). The kinds are declared beside their
// operations.

// beginGuardedOp is the kernel's Begin for an operation with a guardian
// (guard): the guardian starts before the journal is written, so that no
// moment has a journal and no guardian to settle it; stop ends the
// guardian (call it after the journal ended).
func (s *Env) beginGuardedOp(ctx context.Context, name string, kind operation.Kind, intent any) (*operation.Op, func(), error) {
	return s.ops.BeginGuarded(ctx, name, kind, intent, func() func() { return s.Guard(ctx, name) })
}

// registerRecoverers registers the recoverers of the lifecycle's own
// operations, the restart and the reboot, their kinds declared beside them;
// the feature packages register theirs when the front wires them
// (supervisor.New).
func (s *Env) registerRecoverers() {
	s.ops.Register(opRestart, s.recoverRestart)
	s.ops.Register(opReboot, s.recoverReboot)
}

// stopUnknown is the kernel's GiveUp, for a journal of a kind this vmsup
// has no recoverer for (another version's): what it left (a paused or
// frozen guest, half-moved disks) cannot be known, so the VM is stopped
// (QMP quit: QEMU flushes its disks, then SIGKILL) and its host set-up torn
// down from the records; no disk or record is removed.
func (s *Env) stopUnknown(ctx context.Context, name string) error {
	sd, err := s.Systemd(ctx)
	if err != nil {
		return err
	}
	unit := s.state.UnitOf(name)
	st, err := sd.Status(ctx, unit)
	if err != nil || st.Gone() {
		return err
	}
	_, err = s.DownLocked(ctx, name, &LockedUnit{sd: sd, unit: unit, st: st}, DownOptions{Force: true})
	return err
}

// Guard starts the operation's guardian, for the operations that can leave
// a guest frozen if their command dies (a migration): a transient unit
// running "vmsup settle NAME", which waits for the VM's lock (held by this
// command until it ends) and settles what the command left (Settle). So a
// killed or hung-up CLI is only a viewer that went away: nobody needs to
// run the next command for the guest to run again. stop ends the
// guardian; a command that ends cleanly calls it, after it ended its
// journal, before it lets the lock go.
func (s *Env) Guard(ctx context.Context, name string) (stop func()) {
	if s.opts.Self == "" {
		return func() {}
	}
	sd, err := s.Systemd(ctx)
	if err != nil {
		return func() {}
	}
	u := s.settleUnit(name)
	if err := sd.Start(ctx, u); err != nil {
		// One may already wait (from a killed command): it serves this one too.
		s.opts.Logger.Debug("guardian", "vm", name, "err", err)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		sd.KillAndWait(sctx, u.Name)
	}
}

// retryPolicy is how long a guardian retries a recovery that fails (For,
// from the first failure) and how long it waits between two tries (First,
// doubling up to Max).
type retryPolicy struct{ For, First, Max time.Duration }

// defaultSettleRetry: a failed recovery (a QEMU still starting or already
// ending, the other host's vmsup busy or unreachable for a while) is tried
// again for 5 minutes; after that the journal stays for the next command
// on the VM.
func defaultSettleRetry() retryPolicy {
	return retryPolicy{For: 5 * time.Minute, First: time.Second, Max: 30 * time.Second}
}

// settleUnit is the unit of the operation's guardian. It runs as root,
// unconfined, like the vmsup command it stands in for: settling may stop,
// resume or start the VM's QEMU, with its taps, grants and profile
// (systemd-analyze security rates it as any root service, ~9.6).
func (s *Env) settleUnit(name string) units.Unit {
	argv := append([]string{s.opts.Self, "settle", "--root", s.opts.Root}, s.startFlags()...)
	if s.opts.SystemdBus != "" {
		argv = append(argv, "--systemd-bus", s.opts.SystemdBus)
	}
	return units.Unit{Name: vmstore.SettleUnit(name), Description: "vmsup: settle an interrupted operation on " + name,
		Argv: append(argv, name), Collect: true, DeviceAll: true}
}

// Settle is the guardian's work ("vmsup settle NAME"): it waits for the
// VM's lock, then settles any operation left unfinished; a recovery that
// fails is logged and tried again (under the lock each time, which it
// lets go in between) with a growing wait, for up to 5 minutes. The note
// says what was done ("" when the command had ended cleanly).
func (s *Env) Settle(ctx context.Context, name string) (string, error) {
	if err := spec.ValidName(name); err != nil {
		return "", vmerr.Wrap(name, err)
	}
	var giveUp time.Time // from the first failure: the lock may be held for hours before
	wait := s.settleRetry.First
	for try := 1; ; try++ {
		note, err := s.settleOnce(ctx, name)
		if err == nil {
			return note, nil
		}
		if giveUp.IsZero() {
			giveUp = time.Now().Add(s.settleRetry.For)
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(giveUp) {
			return "", fmt.Errorf("%w (gave up after %d tries; the next command on the VM tries again)", err, try)
		}
		s.opts.Logger.Warn("settle: recovery failed; trying again", "vm", name, "try", try, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w (interrupted after %d tries)", err, try)
		case <-time.After(wait):
		}
		wait = min(2*wait, s.settleRetry.Max)
	}
}

// settleOnce takes the VM's lock (waiting for its holder) and recovers.
func (s *Env) settleOnce(ctx context.Context, name string) (string, error) {
	lk, note, err := s.ops.LockWaiting(ctx, name, "settle")
	if err != nil {
		return "", err
	}
	lk.Unlock()
	return note, nil
}

// GuardianUnits are the units of VM name's guardians (the operation's
// settle guardian, the restart guardian), as vmsup starts them: for tests
// that measure their confinement without an operation to settle.
func (s *Env) GuardianUnits(name string) []units.Unit {
	return []units.Unit{s.settleUnit(name), s.guardianUnit(name, "test")}
}
