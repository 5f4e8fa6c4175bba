package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/memstate"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
)

// How a snapshot keeps the guest quiet while its disks switch: the guest
// agent's fsfreeze, bounded, with the thaw guaranteed (here, or by the next
// command's recovery if this one dies); or, for a memory snapshot, a pause
// while the state is saved.

const (
	// freezeTimeout bounds guest-fsfreeze-freeze (it syncs the guest's
	// filesystems); past it the snapshot goes on crash-consistent.
	freezeTimeout = 10 * time.Second
	// thawTimeout bounds each thaw attempt.
	thawTimeout = 5 * time.Second
)

// freeze freezes the guest's filesystems if its agent answers and returns
// the thaw (an error if the guest may still be frozen).
func (t *snapTake) freeze(ctx context.Context) (thaw func() error) {
	q := t.s.quiesce(ctx, t.c, t.name, t.op)
	t.in.Snap.Quiesced, t.frozeAt = q.How, q.At
	return q.Thaw
}

// quiesced is what quiesce did: How says it ("fsfreeze (N filesystems)"
// or why the copy is crash-consistent), At is when the guest was asked to
// freeze (zero when it was not), Thaw always runs after (a no-op when
// nothing froze) and errs if the guest may still be frozen.
type quiesced struct {
	How    string
	At     time.Time
	Frozen bool
	Thaw   func() error
}

// quiesce freezes the guest's filesystems through its agent, bounded, for
// a point in time taken of its disks (a snapshot, a backup's start): a
// guest without an answering agent gets a crash-consistent point. The
// freezing step is journaled first (op), so a command killed while the
// guest is frozen leaves its thaw to recovery (thawGuest).
func (s *Service) quiesce(ctx context.Context, c *qmp.Conn, name string, op *operation.Op) quiesced {
	q := quiesced{How: "crash-consistent (no guest agent)", Thaw: func() error { return nil }}
	actx, cancel := context.WithTimeout(ctx, 2*agentTimeout)
	defer cancel()
	if !c.FrontendOpen(actx, qemuargs.AgentChardevID) {
		return q
	}
	a, done, err := s.env.AgentSession(actx, name)
	if err != nil {
		q.How = fmt.Sprintf("crash-consistent (guest agent: %v)", err)
		return q
	}
	if err := a.Ping(actx); err != nil {
		q.How = fmt.Sprintf("crash-consistent (guest agent: %v)", err)
		done()
		return q
	}
	op.Step(stepFreezing)
	fctx, fcancel := context.WithTimeout(ctx, freezeTimeout)
	q.At = time.Now() // the guest sees the point from here to the thaw
	n, err := a.FSFreeze(fctx)
	fcancel()
	if err != nil {
		q.How = fmt.Sprintf("crash-consistent (fsfreeze failed: %v)", err)
	} else {
		q.How, q.Frozen = fmt.Sprintf("fsfreeze (%d filesystems)", n), true
		op.Step(stepFrozen)
	}
	q.Thaw = func() error {
		defer done()
		return thawAgent(ctx, a)
	}
	return q
}

// thawAgent thaws the guest's filesystems, trying a few times within a
// bound (a busy agent may answer late).
func thawAgent(ctx context.Context, a *qmp.Agent) error {
	var err error
	for range 3 {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), thawTimeout)
		_, err = a.FSThaw(tctx)
		cancel()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("the guest's filesystems may still be frozen (thaw: %v); the next vmsup command on the VM thaws them", err)
}

// thawGuest thaws a guest a killed snapshot may have left frozen; quiet
// when there is no agent.
func (s *Service) thawGuest(ctx context.Context, name string, c *qmp.Conn) error {
	actx, cancel := context.WithTimeout(ctx, 2*agentTimeout)
	defer cancel()
	if !c.FrontendOpen(actx, qemuargs.AgentChardevID) {
		return nil
	}
	a, done, err := s.env.AgentSession(actx, name)
	if err != nil {
		return err
	}
	defer done()
	if st, err := a.FSFreezeStatus(actx); err == nil && st == "thawed" {
		return nil
	}
	return thawAgent(ctx, a)
}

// withPause switches the disks and saves the memory with the guest
// paused, so that the saved state and the frozen images are one moment.
func (t *snapTake) withPause(ctx context.Context, running bool, actions []qmp.TransactionAction) error {
	if !running {
		// QEMU leaves its images inactive after saving the state; only
		// cont takes them back, which would run a guest paused on purpose.
		return errors.New("--memory of a paused VM: resume it first")
	}
	t.in.Paused = true
	if err := t.op.SetIntent(t.in); err != nil {
		return err
	}
	start := time.Now()
	if err := t.c.Stop(ctx); err != nil {
		return err
	}
	t.op.Step(stepPaused)
	if err := t.createRBD(ctx); err != nil {
		_ = t.c.Cont(ctx)
		return err
	}
	if err := t.transaction(ctx, actions); err != nil {
		t.removeRBD(ctx)
		_ = t.c.Cont(ctx)
		return fmt.Errorf("transaction: %w", err)
	}
	t.switched = true
	err := t.saveMemory(ctx)
	if err == nil {
		t.op.Step(stepSaved) // the state is whole: recovery keeps it
	}
	cerr := t.c.Cont(context.WithoutCancel(ctx))
	t.pause = time.Since(start)
	t.in.Snap.Quiesced = "paused, memory saved"
	if err != nil {
		os.Remove(t.in.Snap.Memory)
		return t.memoryFailed(ctx, err)
	}
	if cerr != nil {
		return fmt.Errorf("resume after the memory save: %w", cerr)
	}
	return nil
}

// memoryFailed takes back a memory snapshot whose state could not be
// saved (a full filesystem, QEMU gone): the disks are merged back from the
// overlays (nothing but what the guest wrote since it resumed is in them),
// so the VM runs on the images it ran on before and the undos remove the
// overlays. If QEMU cannot merge them, it keeps running on them and the
// snapshot is recorded without its memory, and the error says so.
func (t *snapTake) memoryFailed(ctx context.Context, cause error) error {
	bg := context.WithoutCancel(ctx)
	var merr error
	for _, l := range t.in.Layers {
		over := l.Overlay
		if _, err := t.s.commitLive(bg, t.name, t.c, snapshottree.Merge{Disk: l.Disk, From: &over, Into: l.Base}, nil, nil); err != nil {
			merr = errors.Join(merr, fmt.Errorf("disk %q: %w", l.Disk, err))
		}
	}
	if merr == nil {
		t.s.removeRBDSnaps(bg, *t.in)
		t.switched = false
		return fmt.Errorf("memory not saved, nothing kept (the VM runs on its images as before): %w", cause)
	}
	t.in.Snap.Memory, t.in.Snap.Quiesced = "", "paused (memory not saved)"
	_ = t.op.SetIntent(t.in)
	return fmt.Errorf("memory not saved (%w), and the disks could not be merged back (%v): the VM runs on the snapshot's overlays, "+
		"and the snapshot is recorded without memory by the next vmsup command", cause, merr)
}

// saveMemory migrates the guest's state into the snapshot's state file,
// which vmsup opens and hands to QEMU: the confined QEMU needs no path.
func (t *snapTake) saveMemory(ctx context.Context) error {
	path := t.in.Snap.Memory
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	unlimited := int64(1 << 40)
	if err := t.c.MigrateSetParameters(ctx, qmp.MigrationParameters{MaxBandwidth: &unlimited}); err != nil {
		return err
	}
	if err := memstate.Save(ctx, t.c, f, t.opts.Progress); err != nil {
		return err
	}
	return f.Sync()
}
