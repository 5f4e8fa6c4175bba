package diskops

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/devices"
	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// recoverDiskMove finishes or undoes a move whose command died (the guest
// kept running all along). QEMU says which image the device is on: on the
// target, the move is recorded and the old image closed; on the source,
// the copy is cancelled and the target taken out again (nodes, grants,
// the file the move made).
func (s *Service) recoverDiskMove(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[moveIntent](op)
	if err != nil {
		return "", err
	}
	app, err := s.h.State().ReadApplied(name)
	if err != nil {
		return "", err
	}
	c, release, err := s.liveQMP(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	if c == nil {
		return s.recoverMoveOff(ctx, name, op, app, &in)
	}
	// A job in its pivot concludes by itself; one still copying (or ready
	// but never told to complete) is cancelled: the device stays put.
	if err := settleMoveJob(ctx, c, in.Job); err != nil {
		return "", err
	}
	on, err := onTarget(ctx, c, &in)
	if err != nil {
		return "", err
	}
	if on {
		recordMove(app, &in)
		if err := s.h.State().RewriteApplied(app); err != nil {
			return "", fmt.Errorf("record: %w", err)
		}
		note := fmt.Sprintf("disk %q had switched to %s: recorded, the old image closed", in.Disk, vmstate.DiskSource(in.Target))
		if err := s.closeMoveSource(ctx, name, c, &in); err != nil {
			note += " (not all of it: " + err.Error() + ")"
		}
		return note, nil
	}
	if err := devices.DelParts(ctx, c, in.Nodes, in.Objects); err != nil {
		return "", err
	}
	if err := s.h.ReleasePaths(ctx, name, in.Rules...); err != nil {
		return "", err
	}
	removeMoveTarget(name, s, &in)
	return fmt.Sprintf("disk %q had not switched: the copy to %s was cancelled and the target removed; it stays on %s",
		in.Disk, vmstate.DiskSource(in.Target), vmstate.DiskSource(in.Source)), nil
}

// recoverMoveOff is recovery with QEMU gone: which image is newer cannot
// be asked. From job-complete on it is the target (in sync when the
// pivot began, then the only one written); before, the source.
func (s *Service) recoverMoveOff(ctx context.Context, name string, op *operation.Op, app *vmstate.Applied, in *moveIntent) (string, error) {
	if op.Has(stepMoveJobComplete) {
		note := recordMove(app, in)
		if err := s.h.State().RewriteApplied(app); err != nil {
			return "", fmt.Errorf("record: %w", err)
		}
		return fmt.Sprintf("QEMU ended during the pivot of disk %q: recorded %s, which holds its newest data. %s", in.Disk, vmstate.DiskSource(in.Target), note), nil
	}
	_ = s.h.ReleasePaths(ctx, name, in.Rules...) // the confinement went with QEMU
	removeMoveTarget(name, s, in)
	return fmt.Sprintf("QEMU ended before the pivot of disk %q: removed the target; it stays on %s", in.Disk, vmstate.DiskSource(in.Source)), nil
}

// removeMoveTarget deletes what the move made on the host: the target
// file, an RBD target's copied key (not the source's own).
func removeMoveTarget(name string, s *Service, in *moveIntent) {
	if in.Created && in.Target.Type == spec.DiskFile {
		os.Remove(in.Target.File)
	}
	if sec := devices.MoveSecretFile(s.paths(name).Dir, in.Target); sec != "" && !in.Source.NeedsSecret() {
		os.Remove(sec)
	}
}

// settleMoveJob brings job id to an end: cancelled while it copies or
// waits at ready, awaited once in its pivot; then dismissed.
func settleMoveJob(ctx context.Context, c *qmp.Conn, id string) error {
	jobs, err := c.QueryJobs(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(jobs, func(j qmp.Job) bool { return j.ID == id })
	if i < 0 {
		return nil
	}
	switch jobs[i].Status {
	case qmp.JobCreated, qmp.JobRunning, qmp.JobPaused, qmp.JobReady, qmp.JobStandby:
		if err := cancelMoveJob(ctx, c, id, true); err != nil && err != errNoMove {
			return err
		}
		return nil
	}
	_, _ = qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Status == qmp.JobConcluded }, nil)
	if err := c.JobDismiss(ctx, id); err != nil && !devices.IsNotFound(err) {
		return err
	}
	return nil
}
