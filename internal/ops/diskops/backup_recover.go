package diskops

import (
	"context"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/backupchain"
)

// A backup whose command died: what it left in QEMU (its jobs, its target
// nodes and fd sets) is taken back, and on disk a point not in the
// manifest yet loses its files and its new bitmaps, so the manifest reads
// as before it and the previous point's bitmap (never touched by the
// copy) still serves the next incremental one. A point the manifest has
// only gets the older bitmaps dropped.

// backupAction is what recovery does with a backup whose command died.
type backupAction uint8

const (
	backupKeepLive backupAction = iota + 1 // recorded, QEMU runs: its jobs dismissed, its nodes removed, older bitmaps dropped
	backupKeepOff                          // recorded, QEMU gone (its jobs with it; the next point drops stale bitmaps)
	backupUndoLive                         // not recorded, QEMU runs: its jobs cancelled, its nodes and the point's files removed
	backupUndoOff                          // not recorded, QEMU gone: the point's files removed
	backupAskAgain                         // QEMU's monitor could not be had: the journal stays
)

// note is what recovery says it did (the CLI shows it).
func (a backupAction) note(in backupIntent) string {
	note := fmt.Sprintf("point %d of %s was recorded", in.Point, in.Dir)
	if a == backupUndoLive || a == backupUndoOff {
		note = fmt.Sprintf("point %d of %s was not recorded: removed its files", in.Point, in.Dir)
	}
	if a == backupKeepLive || a == backupUndoLive {
		note += "; cancelled its jobs and removed its nodes in QEMU"
	}
	return note
}

// decideBackup is what recovery does with a backup whose command died:
// recorded, the point is in the manifest of its chain.
func decideBackup(recorded bool, qemu qemuSeen) backupAction {
	switch {
	case qemu == qemuUnknown:
		return backupAskAgain
	case recorded && qemu == qemuAnswers:
		return backupKeepLive
	case recorded:
		return backupKeepOff
	case qemu == qemuAnswers:
		return backupUndoLive
	}
	return backupUndoOff
}

// recoverBackup settles a backup whose command died (decideBackup).
func (s *Service) recoverBackup(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[backupIntent](op)
	if err != nil {
		return "", err
	}
	m, err := backupchain.Load(in.Dir)
	if err != nil {
		return "", err
	}
	recorded := m != nil && m.Chain == in.Chain && m.Find(in.Point) != nil
	c, qemu, release, err := s.session(ctx, name)
	defer release()
	a := decideBackup(recorded, qemu)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var gerr error
	if c != nil && op.Has(stepFreezing) {
		// Killed around the point's start: the guest may be frozen.
		gerr = s.thawGuest(cctx, name, c)
	}
	switch a {
	case backupAskAgain:
		return "", err
	case backupKeepLive:
		dismissJobs(cctx, c, in)
		detachTargets(cctx, c, in)
		for _, p := range in.Disks {
			_ = dropChainBitmaps(cctx, c, p, in.Chain)
		}
	case backupUndoLive:
		abortJobs(cctx, c, in) // before the nodes go: a job holds its target
		detachTargets(cctx, c, in)
		fallthrough
	case backupUndoOff:
		removeBackupFiles(in)
	}
	return a.note(in), gerr
}
