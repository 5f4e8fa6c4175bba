package diskops

import (
	"context"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// A move whose command died is finished or undone (the guest kept running
// all along). QEMU says which image the device is on: on the target, the
// move is recorded and the old image closed; on the source, the copy is
// cancelled and the target taken out again (nodes, grants, the file the
// move made). With QEMU gone, the journal says which image is newer.

// moveAction is what recovery does with a move whose command died, or
// what it does first and then decides again.
type moveAction uint8

const (
	moveLookJob    moveAction = iota + 1 // look: the move's job
	moveCancelJob                        // the job copies, or waits at ready never told to pivot: cancelled (the device stays put)
	moveAwaitJob                         // the job is in its pivot: it concludes by itself, awaited and dismissed
	moveLookDevice                       // look: the node the disk's device runs on
	moveRecord                           // the device runs on the target: recorded, the old image closed
	moveUndo                             // it runs on the source: the target's nodes, grants and file go
	moveRecordOff                        // QEMU gone from job-complete on: the target (the only one written since) is recorded
	moveUndoOff                          // QEMU gone before it: the target goes
)

// note is what recovery says it did (the CLI shows it); more is what the
// action adds (the record's note, what could not be closed).
func (a moveAction) note(in *moveIntent, more string) string {
	switch a {
	case moveRecord:
		note := fmt.Sprintf("disk %q had switched to %s: recorded, the old image closed", in.Disk, vmstore.DiskSource(in.Target))
		if more != "" {
			note += " (not all of it: " + more + ")"
		}
		return note
	case moveUndo:
		return fmt.Sprintf("disk %q had not switched: the copy to %s was cancelled and the target removed; it stays on %s",
			in.Disk, vmstore.DiskSource(in.Target), vmstore.DiskSource(in.Source))
	case moveRecordOff:
		return fmt.Sprintf("QEMU ended during the pivot of disk %q: recorded %s, which holds its newest data. %s", in.Disk, vmstore.DiskSource(in.Target), more)
	case moveUndoOff:
		return fmt.Sprintf("QEMU ended before the pivot of disk %q: removed the target; it stays on %s", in.Disk, vmstore.DiskSource(in.Source))
	}
	return ""
}

// moveSeen is what recovery sees of a move whose command died.
type moveSeen struct {
	qemu        bool // QEMU runs the VM (its monitor's socket is there)
	jobComplete bool // journaled: job-complete was about to be sent
	jobLooked   bool
	job         *qmp.Job // the move's job, nil for none
	jobSettled  bool     // it was cancelled or awaited
	// deviceLooked, onTarget: the disk's device runs on the target's node.
	deviceLooked, onTarget bool
}

// decideMove is what recovery does with a move whose command died.
func decideMove(s moveSeen) moveAction {
	switch {
	case !s.qemu && s.jobComplete:
		// Which image is newer cannot be asked: from job-complete on it
		// is the target (in sync when the pivot began, then the only one
		// written); before, the source.
		return moveRecordOff
	case !s.qemu:
		return moveUndoOff
	case !s.jobLooked:
		return moveLookJob
	case s.job != nil && !s.jobSettled:
		switch s.job.Status {
		case qmp.JobCreated, qmp.JobRunning, qmp.JobPaused, qmp.JobReady, qmp.JobStandby:
			return moveCancelJob
		}
		return moveAwaitJob
	case !s.deviceLooked:
		return moveLookDevice
	case s.onTarget:
		return moveRecord
	}
	return moveUndo
}

// seeMove looks (b) and settles the job (settle: moveCancelJob or
// moveAwaitJob) until decideMove decides.
func seeMove(ctx context.Context, b blockState, in *moveIntent, settle func(context.Context, moveAction) error, s moveSeen) (moveAction, error) {
	for {
		switch a := decideMove(s); a {
		case moveLookJob:
			jobs, err := b.QueryJobs(ctx)
			if err != nil {
				return a, err
			}
			if j, ok := jobByID(jobs, in.Job); ok {
				s.job = &j
			}
			s.jobLooked = true
		case moveCancelJob, moveAwaitJob:
			if err := settle(ctx, a); err != nil {
				return a, err
			}
			s.jobSettled = true
		case moveLookDevice:
			top, err := b.DeviceNode(ctx, in.Disk)
			if err != nil {
				return a, err
			}
			s.deviceLooked, s.onTarget = true, top == in.Nodes[len(in.Nodes)-1]
		default:
			return a, nil
		}
	}
}

// recoverDiskMove finishes or undoes a move whose command died
// (decideMove).
func (s *Service) recoverDiskMove(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[moveIntent](op)
	if err != nil {
		return "", err
	}
	app, err := s.env.State().ReadApplied(name)
	if err != nil {
		return "", err
	}
	c, release, err := s.liveQMP(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	settle := func(ctx context.Context, a moveAction) error { return settleMoveJob(ctx, c, in.Job, a) }
	a, err := seeMove(ctx, qemuBlocks{c}, &in, settle, moveSeen{qemu: c != nil, jobComplete: op.Has(stepMoveJobComplete)})
	if err != nil {
		return "", err
	}
	switch a {
	case moveRecord, moveRecordOff:
		more := recordMove(app, &in) // what the file still says
		if err := s.env.State().RewriteApplied(app); err != nil {
			return "", fmt.Errorf("record: %w", err)
		}
		if a == moveRecord {
			more = ""
			if err := s.closeMoveSource(ctx, name, c, &in); err != nil {
				more = err.Error()
			}
		}
		return a.note(&in, more), nil
	case moveUndo:
		if err := qdev.DelParts(ctx, c, in.Nodes, in.Objects); err != nil {
			return "", err
		}
		if in.Target.Type == spec.DiskFile {
			if err := qdev.RemoveFileSets(ctx, c, in.Target.File); err != nil {
				return "", err
			}
		}
		if err := s.env.ReleasePaths(ctx, name, in.Rules...); err != nil {
			return "", err
		}
	case moveUndoOff:
		_ = s.env.ReleasePaths(ctx, name, in.Rules...) // the confinement went with QEMU
	}
	removeMoveTarget(name, s, &in)
	return a.note(&in, ""), nil
}

// removeMoveTarget deletes what the move made on the host: the target
// file, an RBD target's copied key (not the source's own).
func removeMoveTarget(name string, s *Service, in *moveIntent) {
	if in.Created && in.Target.Type == spec.DiskFile {
		os.Remove(in.Target.File)
	}
	if sec := qdev.MoveSecretFile(s.paths(name).Dir, in.Target); sec != "" && !in.Source.NeedsSecret() {
		os.Remove(sec)
	}
}

// settleMoveJob brings job id to an end as decideMove says: cancelled
// while it copies or waits at ready; awaited once in its pivot, then
// dismissed.
func settleMoveJob(ctx context.Context, c *qmp.Conn, id string, a moveAction) error {
	if a == moveCancelJob {
		if err := cancelMoveJob(ctx, c, id, true); err != nil && err != errNoMove {
			return err
		}
		return nil
	}
	_, _ = qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Status == qmp.JobConcluded }, nil)
	if err := c.JobDismiss(ctx, id); err != nil && !qdev.IsNotFound(err) {
		return err
	}
	return nil
}
