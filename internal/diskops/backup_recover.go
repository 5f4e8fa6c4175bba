package diskops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/backup"
	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/internal/vmstate"
)

// recoverBackup takes back what a backup whose command died left in QEMU
// (its jobs cancelled, its target nodes and fd sets removed) and on disk:
// a point not in the manifest yet loses its files and its new bitmaps,
// so the manifest reads as before it and the previous point's bitmap
// (never touched by the copy) still serves the next incremental one. A
// point the manifest has only gets the older bitmaps dropped.
func (s *Service) recoverBackup(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[backupIntent](op)
	if err != nil {
		return "", err
	}
	m, err := backup.Load(in.Dir)
	if err != nil {
		return "", err
	}
	recorded := m != nil && m.Chain == in.Chain && m.Find(in.Point) != nil
	note := fmt.Sprintf("point %d of %s was recorded", in.Point, in.Dir)
	if !recorded {
		note = fmt.Sprintf("point %d of %s was not recorded: removed its files", in.Point, in.Dir)
	}
	c, release, err := s.h.QMPSession(ctx, name)
	switch {
	case err == nil:
		defer release()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if recorded {
			dismissJobs(cctx, c, in)
			detachTargets(cctx, c, in)
			for _, p := range in.Disks {
				_ = dropChainBitmaps(cctx, c, p, in.Chain)
			}
		} else {
			abortJobs(cctx, c, in) // before the nodes go: a job holds its target
			detachTargets(cctx, c, in)
		}
		note += "; cancelled its jobs and removed its nodes in QEMU"
	case errors.Is(err, vmstate.ErrNotRunning), errors.Is(err, vmstate.ErrNotFound):
		// QEMU is gone with its jobs; the images keep stale bitmaps,
		// which the next point drops.
	default:
		return "", err
	}
	if !recorded {
		removeBackupFiles(in)
	}
	return note, nil
}
