package diskops

import (
	"context"
	"fmt"

	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qmp"
)

// RBD disks are snapshotted by Ceph (`rbd snap create`), not by an
// overlay: with the guest paused, so that they and the file disks' one
// transaction are the same moment. A revert rolls the image back, a
// removal removes the RBD snapshot.

// switchAll switches the file disks (one transaction) and, with RBD
// disks, snapshots those too with the guest paused around both.
func (t *snapTake) switchAll(ctx context.Context, running bool, actions []qmp.TransactionAction) error {
	if len(t.in.RBD) == 0 {
		return t.transaction(ctx, actions)
	}
	if running {
		if err := t.c.Stop(ctx); err != nil {
			return err
		}
		defer func() { _ = t.c.Cont(context.WithoutCancel(ctx)) }()
	}
	if err := t.createRBD(ctx); err != nil {
		return err
	}
	if err := t.transaction(ctx, actions); err != nil {
		t.removeRBD(ctx)
		return err
	}
	return nil
}

// transaction runs the file disks' snapshot actions (none for a VM of RBD
// disks only).
func (t *snapTake) transaction(ctx context.Context, actions []qmp.TransactionAction) error {
	if len(actions) == 0 {
		return nil
	}
	return t.c.Transaction(ctx, actions, false)
}

// createRBD makes the RBD snapshots; on failure none is left.
func (t *snapTake) createRBD(ctx context.Context) error {
	for i, d := range t.in.RBD {
		if err := t.s.env.Tools().RBDSnap(ctx, d, "create", snapshottree.RBDSnapName(t.in.Tag)); err != nil {
			for _, m := range t.in.RBD[:i] {
				_ = t.s.env.Tools().RBDSnap(context.WithoutCancel(ctx), m, "rm", snapshottree.RBDSnapName(t.in.Tag))
			}
			return fmt.Errorf("disk %q: %w", d.Name, err)
		}
	}
	return nil
}

func (t *snapTake) removeRBD(ctx context.Context) { t.s.removeRBDSnaps(ctx, *t.in) }

// removeRBDSnaps removes a snapshot's RBD snapshots (those that exist).
func (s *Service) removeRBDSnaps(ctx context.Context, in snapIntent) {
	for _, d := range in.RBD {
		if err := s.env.Tools().RBDSnap(ctx, d, "rm", snapshottree.RBDSnapName(in.Tag)); err != nil {
			s.env.Opts().Logger.Warn("rbd snapshot left", "disk", d.Name, "err", err)
		}
	}
}

// rbdSnaps is what the tree records of a take's RBD disks.
func rbdSnaps(in snapIntent) map[string]string {
	if len(in.RBD) == 0 {
		return nil
	}
	m := map[string]string{}
	for _, d := range in.RBD {
		m[d.Name] = snapshottree.RBDSnapName(in.Tag)
	}
	return m
}
