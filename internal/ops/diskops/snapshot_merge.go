package diskops

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// Merging a snapshot's image down (a removal) is the one disk operation
// that can lose data if done twice: once QEMU pivoted a disk from From onto
// Into (an active commit), the guest writes Into, and From is stale; a
// second commit of From would write old data over new. So whether a merge
// still has to be done is learnt from QEMU (does a device still read
// From? is the commit job still there?) or, with QEMU gone, from the
// journal ("pivot" is journaled before the job is completed) and QEMU's
// event log (the job's BLOCK_JOB_COMPLETED), never from the record alone.

// Steps of a merge in the journal, per disk: the commit job is about to
// pivot the disk onto the merged image, it did, the merge is done.
func stepPivot(disk string) operation.Step   { return operation.Step("pivot " + disk) }
func stepPivoted(disk string) operation.Step { return operation.Step("pivoted " + disk) }
func stepMerged(disk string) operation.Step  { return operation.Step("merged " + disk) }

// commitJobID is the id of the commit job that merges disk's image.
func commitJobID(disk string) string { return "vmsup-commit-" + disk }

// merge commits m.From into m.Into unless that was done, live with QEMU's
// block-commit when QEMU (c) runs the VM, else with qemu-img. Images on
// From are re-based on Into (QEMU re-bases the one it has open itself).
func (s *Service) merge(ctx context.Context, name string, c *qmp.Conn, op *operation.Op, m snapshottree.Merge, progress func(string, int64, int64)) error {
	var open string // the image QEMU re-based itself
	var err error
	if c != nil {
		open, err = s.mergeLive(ctx, name, c, op, m, progress)
	} else {
		err = s.mergeOffline(ctx, name, op, m)
	}
	if err != nil {
		return err
	}
	for _, r := range m.Rebase {
		if r == open || !exists(r) {
			continue
		}
		if err := s.env.Tools().Rebase(ctx, r, m.Into.Path, m.Into.Format); err != nil {
			return err
		}
	}
	return nil
}

// mergeAction is how one disk's merge is brought about, where a removal
// (or its recovery) finds it.
type mergeAction uint8

const (
	mergeFinishPivot   mergeAction = iota + 1 // a killed removal's active commit: pivoted once ready
	mergeFinishJob                            // a killed removal's commit job that needs no pivot: awaited
	mergeWasDone                              // QEMU left From, or its file is gone: merged before
	mergeCloseStale                           // From is in no device's chain: merged, its node left open: closed
	mergeCommitLive                           // block-commit in the running QEMU
	mergeWasPivoted                           // QEMU ended after it pivoted the disk (its event log says): Into has it all
	mergeCommitOffline                        // qemu-img commit
)

// mergeSeen is what a merge finds of its disk.
type mergeSeen struct {
	live bool // QEMU runs the VM
	// With QEMU: the commit job a killed removal left (job, if hasJob),
	// the format node open on From ("" for none), whether that node is in
	// a device's chain.
	job     qmp.Job
	hasJob  bool
	node    string
	inChain bool
	// With QEMU gone: whether From's file exists; whether "pivot" was
	// journaled, and (only then read) whether QEMU's event log has the
	// commit's completion.
	fromExists, pivot, completed bool
}

// decideMerge is how one disk's merge is brought about. Done twice, a
// merge would write From's stale data over what the guest wrote to Into
// after the pivot: so QEMU (or its event log) says whether it was done.
func decideMerge(m mergeSeen) mergeAction {
	switch {
	case m.live && m.hasJob && m.job.Type == "commit" && m.job.Status != qmp.JobConcluded:
		return mergeFinishPivot
	case m.live && m.hasJob:
		return mergeFinishJob
	case m.live && m.node == "":
		return mergeWasDone
	case m.live && !m.inChain:
		return mergeCloseStale
	case m.live:
		return mergeCommitLive
	case !m.fromExists:
		return mergeWasDone
	case m.pivot && m.completed:
		return mergeWasPivoted
	}
	return mergeCommitOffline
}

// seeMergeLive looks at merge m in the running QEMU.
func seeMergeLive(ctx context.Context, b blockState, m snapshottree.Merge) (mergeSeen, error) {
	seen := mergeSeen{live: true}
	jobs, err := b.QueryJobs(ctx)
	if err != nil {
		return seen, err
	}
	seen.job, seen.hasJob = jobByID(jobs, commitJobID(m.Disk))
	if top, err := b.NodeOn(ctx, m.From.Path); err == nil {
		seen.node = top.NodeName
		_, _, err := b.RootOf(ctx, top.NodeName)
		seen.inChain = err == nil
	}
	return seen, nil
}

// mergeLive merges m in the running QEMU (decideMerge).
func (s *Service) mergeLive(ctx context.Context, name string, c *qmp.Conn, op *operation.Op, m snapshottree.Merge, progress func(string, int64, int64)) (string, error) {
	seen, err := seeMergeLive(ctx, qemuBlocks{c}, m)
	if err != nil {
		return "", err
	}
	switch a := decideMerge(seen); a {
	case mergeFinishPivot, mergeFinishJob:
		return "", s.finishCommitJob(ctx, name, c, op, m, seen.node, a == mergeFinishPivot, progress)
	case mergeCloseStale:
		closeMerged(ctx, c, seen.node, m.From.Path)
		return "", nil
	case mergeCommitLive:
		return s.commitLive(ctx, name, c, m, progress, op)
	}
	return "", nil
}

// finishCommitJob brings a commit job a killed removal left to its end:
// an active commit ready to pivot is completed (the guest's writes are on
// both images then), one still copying is waited for first; then From's
// node (top, if QEMU had it) is closed.
func (s *Service) finishCommitJob(ctx context.Context, name string, c *qmp.Conn, op *operation.Op, m snapshottree.Merge, top string, pivot bool, progress func(string, int64, int64)) error {
	prog := func(j qmp.Job) {
		if progress != nil {
			progress(m.Disk, j.CurrentProgress, j.TotalProgress)
		}
	}
	if err := s.completeCommit(ctx, name, c, op, m.Disk, pivot, prog); err != nil {
		return err
	}
	if top != "" {
		closeMerged(ctx, c, top, m.From.Path)
	}
	return nil
}

// completeCommit waits for commit job of disk, pivots an active one
// (journaled first: "pivot DISK"), and dismisses it. active is false for a
// job that needs no pivot (or has concluded).
func (s *Service) completeCommit(ctx context.Context, name string, c *qmp.Conn, op *operation.Op, disk string, active bool, prog func(qmp.Job)) error {
	id := commitJobID(disk)
	j, err := qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Status == qmp.JobReady || j.Ended() }, prog)
	if err != nil {
		_ = c.JobDismiss(context.WithoutCancel(ctx), id)
		return err
	}
	if active && j.Status == qmp.JobReady {
		if op != nil {
			op.Step(stepPivot(disk))
		}
		if err := c.JobComplete(ctx, id); err != nil {
			return err
		}
		if op != nil {
			op.Step(stepPivoted(disk)) // the guest writes Into from here
		}
	}
	_, err = qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Status == qmp.JobConcluded }, prog)
	_ = c.JobDismiss(context.WithoutCancel(ctx), id)
	return err
}

// mergeOffline merges m with qemu-img, unless QEMU did before it ended
// (decideMerge): it had pivoted the disk onto Into (its event log has the
// commit's completion), or From is gone.
func (s *Service) mergeOffline(ctx context.Context, name string, op *operation.Op, m snapshottree.Merge) error {
	seen := mergeSeen{fromExists: exists(m.From.Path), pivot: op != nil && op.Has(stepPivot(m.Disk))}
	if seen.fromExists && seen.pivot {
		done, err := s.commitCompleted(name, commitJobID(m.Disk), op.Started())
		if err != nil {
			return fmt.Errorf("whether QEMU finished merging it before it ended: %w", err)
		}
		seen.completed = done
	}
	if decideMerge(seen) != mergeCommitOffline {
		return nil // From is stale or gone: Into has it all
	}
	return s.env.Tools().Commit(ctx, m.From.Path)
}

// commitCompleted reads the VM's QEMU events since an operation began for
// job id's successful end (BLOCK_JOB_COMPLETED without an error).
func (s *Service) commitCompleted(name, id string, since time.Time) (bool, error) {
	recs, err := eventlog.History(s.paths(name).EventHistory(), since)
	if err != nil {
		return false, err
	}
	if app, err := s.env.State().ReadApplied(name); err == nil && app.EventLog != "" {
		live, _ := eventlog.QEMUEvents(app.EventLog+".out", name) // not archived yet
		recs = append(recs, live...)
	}
	for _, r := range recs {
		if r.Source != eventlog.SourceQEMU || r.Event != "BLOCK_JOB_COMPLETED" || r.Time.Before(since) {
			continue
		}
		var d struct {
			Device string `json:"device"`
			Error  string `json:"error"`
		}
		if json.Unmarshal(r.Data, &d) == nil && d.Device == id && d.Error == "" {
			return true, nil
		}
	}
	return false, nil
}

// commitLive runs block-commit of From into Into in the running QEMU and
// returns the image above From that QEMU re-based ("" for an active
// commit, which pivots the disk onto Into, journaled in op first).
func (s *Service) commitLive(ctx context.Context, name string, c *qmp.Conn, m snapshottree.Merge, progress func(string, int64, int64), op *operation.Op) (string, error) {
	top, err := qdev.FindNode(ctx, c, m.From.Path)
	if err != nil {
		return "", err
	}
	base, err := qdev.FindNode(ctx, c, m.Into.Path)
	if err != nil {
		return "", err
	}
	if err := s.confineInto(ctx, name, c, base.NodeName, m.Into.Path); err != nil {
		return "", err
	}
	device, above, err := qdev.RootOf(ctx, c, top.NodeName)
	if err != nil {
		return "", err
	}
	id := commitJobID(m.Disk)
	no := false
	cm := qmp.Commit{JobID: id, Device: device, TopNode: top.NodeName, BaseNode: base.NodeName, AutoDismiss: &no}
	if above != "" {
		cm.BackingFile = m.Into.Path // not the base's /dev/fdset/N
	}
	if err := c.BlockCommit(ctx, cm); err != nil {
		return "", err
	}
	prog := func(j qmp.Job) {
		if progress != nil {
			progress(m.Disk, j.CurrentProgress, j.TotalProgress)
		}
	}
	if err := s.completeCommit(ctx, name, c, op, m.Disk, above == "", prog); err != nil {
		return "", err
	}
	closeMerged(ctx, c, top.NodeName, m.From.Path)
	return above, nil
}

// confineInto grants QEMU Into read-write where it opened it by name (a
// SATA disk's chain, from the header): the commit writes it. Into on a
// descriptor needs nothing: its fd set holds a read-write one
// (internal/lifecycle/diskfds).
func (s *Service) confineInto(ctx context.Context, name string, c *qmp.Conn, node, path string) error {
	if fd, err := qdev.OnDescriptor(ctx, c, node); err != nil || fd {
		return err
	}
	return s.env.ConfinePaths(ctx, name, units.PathRule{Path: path, Mode: "rwk"})
}

// closeMerged closes merged image path's node and takes back its fd set.
func closeMerged(ctx context.Context, c *qmp.Conn, node, path string) {
	qdev.CloseNode(ctx, c, node)
	_ = qdev.RemoveFileSets(ctx, c, path)
}
