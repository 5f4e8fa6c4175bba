package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Every command that takes several steps on a running VM journals them
// (internal/vmstate: intent first, each step as it is done), so that the
// next command on the VM can finish or undo what a killed one left: it
// calls recover under the VM's lock, before it does its own work.

// Operation kinds in the journal.
const (
	opDiskAttach = "disk-attach"
	opDiskDetach = "disk-detach"
	opNICAttach  = "nic-attach"
	opNICDetach  = "nic-detach"
	opResize     = "set"
	opRestart    = "restart"
	opMigrateOut = "migrate"
	opMigrateIn  = "migrate-receive"
)

// beginOp journals an operation's intent before it acts. A pending one (its
// command died) is recovered first; the caller holds the VM's lock.
func (s *Supervisor) beginOp(ctx context.Context, name, kind string, intent any) (*vmstate.Op, error) {
	if _, err := s.recover(ctx, name, kind); err != nil {
		return nil, err
	}
	op, err := s.state.BeginOp(name, kind, intent)
	if err != nil {
		return nil, fmt.Errorf("%w (nothing was done)", err)
	}
	return op, nil
}

// beginGuardedOp is beginOp for an operation with a guardian (guard): the
// guardian starts before the journal is written, so that no moment has a
// journal and no guardian to settle it; stop ends the guardian (call it
// after the journal ended).
func (s *Supervisor) beginGuardedOp(ctx context.Context, name, kind string, intent any) (op *vmstate.Op, stop func(), err error) {
	if _, err := s.recover(ctx, name, kind); err != nil {
		return nil, nil, err
	}
	stop = s.guard(ctx, name)
	if op, err = s.state.BeginOp(name, kind, intent); err != nil {
		stop()
		return nil, nil, fmt.Errorf("%w (nothing was done)", err)
	}
	return op, stop, nil
}

// traced is the AfterStep of an operation: each step is journaled as done,
// then Options.AfterStep sees it.
func (s *Supervisor) traced(op *vmstate.Op) func(vm, step string) {
	return func(vm, step string) {
		if err := op.Step(step); err != nil {
			s.opts.Logger.Warn("journal", "vm", vm, "step", step, "err", err)
		}
		if s.opts.AfterStep != nil {
			s.opts.AfterStep(vm, step)
		}
	}
}

// recover finishes or undoes the VM's unfinished operation, if a command
// left one: what it did is read from QEMU's and systemd's real state, and
// the intent says what it meant to do. The caller holds the VM's lock (so
// the operation's own command is gone); by is the command recovering. The
// note says what was done ("" when there was nothing).
func (s *Supervisor) recover(ctx context.Context, name, by string) (string, error) {
	op, err := s.state.PendingOp(name)
	if err != nil || op == nil {
		return "", err
	}
	defer op.Close() // (ended below when recovered; else left for the next command)
	var note string
	switch op.Kind {
	case opDiskAttach:
		note, err = s.recoverDiskAttach(ctx, name, op)
	case opDiskDetach:
		note, err = s.recoverDiskDetach(ctx, name, op)
	case opNICAttach:
		note, err = s.recoverNICAttach(ctx, name, op)
	case opNICDetach:
		note, err = s.recoverNICDetach(ctx, name, op)
	case opResize:
		note, err = s.recoverResize(ctx, name, op)
	case opRestart:
		note, err = s.recoverRestart(ctx, name, op, by)
	case opMigrateOut:
		note, err = s.recoverMigrateOut(ctx, name, op)
	case opMigrateIn:
		note, err = s.recoverMigrateIn(ctx, name, op)
	case opReboot:
		note, err = s.recoverReboot(ctx, name, op)
	case opApplySet:
		note, err = s.recoverApplySet(ctx, name, op)
	case opHostDevAttach:
		note, err = s.recoverHostDevAttach(ctx, name, op)
	case opHostDevDetach:
		note, err = s.recoverHostDevDetach(ctx, name, op)
	case opSnapshot:
		note, err = s.recoverSnapshot(ctx, name, op)
	case opNBDExport:
		note, err = s.recoverNBDExport(ctx, name, op)
	case opSnapshotRevert:
		note, err = s.recoverRevert(ctx, name, op)
	case opSnapshotRemove:
		note, err = s.recoverSnapshotRemove(ctx, name, op)
	case opDiskMove:
		note, err = s.recoverDiskMove(ctx, name, op)
	case opBackup:
		note, err = s.recoverBackup(ctx, name, op)
	case opClone:
		note, err = s.recoverClone(ctx, name, op)
	default:
		note = "dropped an unreadable journal (" + op.Kind + ")"
	}
	if err != nil {
		return "", vmErr(name, fmt.Errorf("an interrupted %s (pid %d, %s) could not be recovered: %w",
			op.Kind, op.PID, op.Started.Format("15:04:05"), err))
	}
	if err := op.End(); err != nil {
		return note, vmErr(name, fmt.Errorf("journal: %w", err))
	}
	s.opts.Logger.Warn("recovered an interrupted operation", "vm", name, "op", op.Kind, "pid", op.PID, "done", op.Done, "note", note)
	return fmt.Sprintf("recovered an interrupted %s: %s", op.Kind, note), nil
}

// recoverUnlocked is recover for a command that does not take the VM's lock
// (status): it recovers only when no other command holds the lock, which
// means the operation's command is gone.
func (s *Supervisor) recoverUnlocked(ctx context.Context, name string) (string, error) {
	if _, err := os.Stat(s.paths(name).Records); err != nil {
		return "", nil
	}
	op, err := s.state.PendingOp(name)
	if err != nil || op == nil {
		return "", err
	}
	op.Close()
	lk, err := s.state.TryLock(ctx, name, "recover")
	if err != nil || lk == nil {
		return "", err // the operation is still going
	}
	defer lk.Unlock()
	return s.recover(ctx, name, "status")
}

// guard starts the operation's guardian, for the operations that can leave
// a guest frozen if their command dies (a migration): a transient unit
// running "vmsup settle NAME", which waits for the VM's lock (held by this
// command until it ends) and settles what the command left (Settle). So a
// killed or hung-up CLI is only a viewer that went away: nobody needs to
// run the next command for the guest to run again. stop ends the
// guardian; a command that ends cleanly calls it, after it ended its
// journal, before it lets the lock go.
func (s *Supervisor) guard(ctx context.Context, name string) (stop func()) {
	if s.opts.Self == "" {
		return func() {}
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return func() {}
	}
	argv := []string{s.opts.Self, "settle", "--root", s.opts.Root}
	if s.opts.SystemdBus != "" {
		argv = append(argv, "--systemd-bus", s.opts.SystemdBus)
	}
	u := units.Unit{Name: vmstate.SettleUnit(name), Description: "vmsup: settle an interrupted operation on " + name,
		Argv: append(argv, name), Collect: true, DeviceAll: true}
	if err := sd.Start(ctx, u); err != nil {
		// One may already wait (from a killed command): it serves this one too.
		s.opts.Logger.Debug("guardian", "vm", name, "err", err)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		_ = sd.Kill(sctx, u.Name, syscall.SIGKILL)
		sd.WaitGone(sctx, u.Name)
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

// Settle is the guardian's work ("vmsup settle NAME"): it waits for the
// VM's lock, then settles any operation left unfinished; a recovery that
// fails is logged and tried again (under the lock each time, which it
// lets go in between) with a growing wait, for up to 5 minutes. The note
// says what was done ("" when the command had ended cleanly).
func (s *Supervisor) Settle(ctx context.Context, name string) (string, error) {
	if err := spec.ValidName(name); err != nil {
		return "", vmErr(name, err)
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
func (s *Supervisor) settleOnce(ctx context.Context, name string) (string, error) {
	lk, err := s.state.Lock(ctx, name, "settle", true)
	if err != nil {
		return "", err
	}
	defer lk.Unlock()
	return s.recover(ctx, name, "settle")
}

func intentOf[T any](op *vmstate.Op) (T, error) {
	var in T
	if len(op.Intent) == 0 {
		return in, errors.New("the journal has no intent")
	}
	err := json.Unmarshal(op.Intent, &in)
	return in, err
}
