package qmp

import (
	"context"
	"fmt"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// Block jobs: backup, commit, stream and mirror run in QEMU's background;
// the commands return once the job exists. A job goes created -> running
// -> (ready, for mirror and active commit, until completed or cancelled)
// -> waiting -> pending -> concluded -> null (dismissed). With auto-finalize
// or auto-dismiss false it stops at pending or concluded until told.

// Backup is blockdev-backup's argument: copy Device's node to Target (an
// existing node). Sync is "full", "top", "none", "incremental" or "bitmap";
// the last two need Bitmap, and "bitmap" also BitmapMode ("on-success",
// "always", "never": when the bitmap is cleared).
type Backup struct {
	JobID        string `json:"job-id,omitempty"`
	Device       string `json:"device"`
	Target       string `json:"target"`
	Sync         string `json:"sync"`
	Bitmap       string `json:"bitmap,omitempty"`
	BitmapMode   string `json:"bitmap-mode,omitempty"`
	Speed        int64  `json:"speed,omitempty"` // bytes per second; 0: unlimited
	AutoFinalize *bool  `json:"auto-finalize,omitempty"`
	AutoDismiss  *bool  `json:"auto-dismiss,omitempty"`
}

// Commit is block-commit's argument: merge the chain from TopNode (the
// active layer if empty) down into BaseNode (the bottom if empty). An
// active commit becomes "ready" and ends with JobComplete, which pivots the
// device to the base.
type Commit struct {
	JobID    string `json:"job-id,omitempty"`
	Device   string `json:"device"`
	TopNode  string `json:"top-node,omitempty"`
	BaseNode string `json:"base-node,omitempty"`
	// BackingFile is written into the header of the image above TopNode
	// (not for an active commit): QEMU would write BaseNode's filename,
	// a /dev/fdset/N for a base on a descriptor.
	BackingFile  string `json:"backing-file,omitempty"`
	Speed        int64  `json:"speed,omitempty"`
	AutoFinalize *bool  `json:"auto-finalize,omitempty"`
	AutoDismiss  *bool  `json:"auto-dismiss,omitempty"`
}

// Stream is block-stream's argument: copy into Device's node the data of
// its backing chain down to BaseNode (everything if empty), then drop
// those layers from the chain.
type Stream struct {
	JobID        string `json:"job-id,omitempty"`
	Device       string `json:"device"`
	BaseNode     string `json:"base-node,omitempty"`
	Speed        int64  `json:"speed,omitempty"`
	AutoFinalize *bool  `json:"auto-finalize,omitempty"`
	AutoDismiss  *bool  `json:"auto-dismiss,omitempty"`
}

// Mirror is blockdev-mirror's argument: copy Device's node to Target and
// keep it in sync. Sync is "full", "top" or "none"; CopyMode "background"
// (default) or "write-blocking" (guest writes wait for the target, so the
// copy converges under heavy writes). It becomes "ready"; JobComplete then
// pivots the device to Target, BlockJobCancel leaves it on the source.
type Mirror struct {
	JobID        string `json:"job-id,omitempty"`
	Device       string `json:"device"`
	Target       string `json:"target"`
	Sync         string `json:"sync"`
	CopyMode     string `json:"copy-mode,omitempty"`
	Speed        int64  `json:"speed,omitempty"`
	AutoFinalize *bool  `json:"auto-finalize,omitempty"`
	AutoDismiss  *bool  `json:"auto-dismiss,omitempty"`
}

// BlockdevBackup starts a backup job.
func (c *Conn) BlockdevBackup(ctx context.Context, b Backup) error {
	return c.Execute(ctx, "blockdev-backup", b, nil)
}

// BlockCommit starts a commit job.
func (c *Conn) BlockCommit(ctx context.Context, m Commit) error {
	return c.Execute(ctx, "block-commit", m, nil)
}

// BlockStream starts a stream job.
func (c *Conn) BlockStream(ctx context.Context, s Stream) error {
	return c.Execute(ctx, "block-stream", s, nil)
}

// BlockdevMirror starts a mirror job.
func (c *Conn) BlockdevMirror(ctx context.Context, m Mirror) error {
	return c.Execute(ctx, "blockdev-mirror", m, nil)
}

// Job is one entry of query-jobs. Progress is in arbitrary units (bytes for
// block jobs) and TotalProgress may grow while the job runs. Error is set
// once a job ends in failure or was cancelled.
type Job struct {
	ID              string    `json:"id"`
	Type            string    `json:"type"` // "backup", "commit", "stream", "mirror", ...
	Status          JobStatus `json:"status"`
	Error           string    `json:"error,omitempty"`
	CurrentProgress int64     `json:"current-progress"`
	TotalProgress   int64     `json:"total-progress"`
}

// ended reports whether the job can change no more.
func (j Job) ended() bool { return j.Status == JobConcluded || j.Status == JobNull }

// Ended reports whether the job can change no more (concluded, or gone).
func (j Job) Ended() bool { return j.ended() }

// QueryJobs lists QEMU's jobs, running or waiting to be dismissed.
func (c *Conn) QueryJobs(ctx context.Context) ([]Job, error) {
	var js []Job
	err := c.Execute(ctx, "query-jobs", nil, &js)
	return js, err
}

func (c *Conn) jobCommand(ctx context.Context, command, id string) error {
	args := struct {
		ID string `json:"id"`
	}{id}
	return c.Execute(ctx, command, args, nil)
}

// JobComplete ends a "ready" job (mirror, active commit) by pivoting the
// device to the new node.
func (c *Conn) JobComplete(ctx context.Context, id string) error {
	return c.jobCommand(ctx, "job-complete", id)
}

// JobCancel cancels a job; it goes through "aborting" and concludes with
// an error.
func (c *Conn) JobCancel(ctx context.Context, id string) error {
	return c.jobCommand(ctx, "job-cancel", id)
}

// JobFinalize commits a "pending" job started with auto-finalize false
// (for a grouped transaction: the whole group).
func (c *Conn) JobFinalize(ctx context.Context, id string) error {
	return c.jobCommand(ctx, "job-finalize", id)
}

// JobDismiss removes a "concluded" job started with auto-dismiss false.
func (c *Conn) JobDismiss(ctx context.Context, id string) error {
	return c.jobCommand(ctx, "job-dismiss", id)
}

// BlockJobCancel cancels a block job by its id (QEMU's "device" argument
// names the job). On a "ready" mirror without force, the job instead
// completes without pivoting and without error: the target is a
// consistent copy and the device stays on the source. With force it is a
// real cancel: the job concludes with error "Operation canceled" (7.2).
func (c *Conn) BlockJobCancel(ctx context.Context, device string, force bool) error {
	args := struct {
		Device string `json:"device"`
		Force  bool   `json:"force,omitempty"`
	}{device, force}
	return c.Execute(ctx, "block-job-cancel", args, nil)
}

// JobError is WaitJob's error for a job that failed, was cancelled, ended
// before done was satisfied, or vanished.
type JobError struct {
	Job    Job    // the last state seen
	Reason string // QEMU's error text, or what happened
}

func (e *JobError) Error() string {
	return fmt.Sprintf("qmp: job %s (%s, %s): %s", e.Job.ID, e.Job.Type, e.Job.Status, e.Reason)
}

// jobPollInterval is how often WaitJob polls when no event wakes it.
const jobPollInterval = 100 * time.Millisecond

// WaitJob polls query-jobs until done(job) returns true (nil: the job
// concluded without error) and returns the job as last seen. progress, if
// not nil, sees every poll. JOB_STATUS_CHANGE events wake it early. It
// fails with a *JobError when the job ends with an error or without done
// being satisfied, and when it vanishes; ctx bounds it.
//
// A job with auto-dismiss (QEMU's default) vanishes once it ends: WaitJob
// then relies on the BLOCK_JOB_COMPLETED or BLOCK_JOB_CANCELLED event it
// saw, which it misses if the job ended before WaitJob subscribed. Start
// jobs with AutoDismiss false to read their outcome reliably.
func WaitJob(ctx context.Context, c *Conn, id string, done func(Job) bool, progress func(Job)) (Job, error) {
	if done == nil {
		done = Job.ended
	}
	sub, unsub := c.Subscribe(ctx)
	defer unsub()
	tick := time.NewTicker(jobPollInterval)
	defer tick.Stop()
	last := Job{ID: id}
	var outcome *jobOutcome
	for {
		jobs, err := c.QueryJobs(ctx)
		if err != nil {
			return last, fmt.Errorf("qmp: waiting for job %s: %w", id, err)
		}
		j, found := findJob(jobs, id)
		if !found {
			// Events precede the reply that no longer lists the job.
			return vanished(last, drainOutcome(sub, id, outcome), done, progress)
		}
		last = j
		if progress != nil {
			progress(j)
		}
		switch {
		case j.ended() && j.Error != "":
			return j, &JobError{j, j.Error}
		case done(j):
			return j, nil
		case j.ended():
			return j, &JobError{j, "ended before reaching the state waited for"}
		}
		for woken := false; !woken; {
			select {
			case <-ctx.Done():
				return last, fmt.Errorf("qmp: waiting for job %s (%s): %w", id, last.Status, ctx.Err())
			case <-tick.C:
				woken = true
			case ev, ok := <-sub:
				if !ok {
					sub = nil // the connection ended: the next query says so
					woken = true
					continue
				}
				if o := jobEnd(ev, id); o != nil {
					outcome = o
				}
				woken = ev.Event == "JOB_STATUS_CHANGE" && ev.Data["id"] == id
			}
		}
	}
}

// jobOutcome is what a BLOCK_JOB_COMPLETED or _CANCELLED event said.
type jobOutcome struct {
	cancelled bool
	err       string
}

// jobEnd returns the outcome ev reports for job id, nil if none. Block job
// events name the job in "device".
func jobEnd(ev qmp.Event, id string) *jobOutcome {
	if ev.Data["device"] != id {
		return nil
	}
	switch ev.Event {
	case "BLOCK_JOB_COMPLETED":
		msg, _ := ev.Data["error"].(string)
		return &jobOutcome{err: msg}
	case "BLOCK_JOB_CANCELLED":
		return &jobOutcome{cancelled: true}
	}
	return nil
}

// drainOutcome reads the events already queued on sub for job id's
// outcome, if o does not have it yet.
func drainOutcome(sub <-chan qmp.Event, id string, o *jobOutcome) *jobOutcome {
	for o == nil {
		select {
		case ev, ok := <-sub:
			if !ok {
				return nil
			}
			o = jobEnd(ev, id)
		default:
			return nil
		}
	}
	return o
}

// vanished judges a job that query-jobs no longer lists (auto-dismissed).
func vanished(last Job, o *jobOutcome, done func(Job) bool, progress func(Job)) (Job, error) {
	switch {
	case o == nil:
		return last, &JobError{last, "no longer listed by query-jobs, outcome unknown (dismissed?)"}
	case o.cancelled:
		last.Status, last.Error = JobNull, "cancelled"
		return last, &JobError{last, "cancelled"}
	case o.err != "":
		last.Status, last.Error = JobNull, o.err
		return last, &JobError{last, o.err}
	}
	last.Status = JobNull
	if progress != nil {
		progress(last)
	}
	if !done(last) {
		return last, &JobError{last, "ended before reaching the state waited for"}
	}
	return last, nil
}

func findJob(jobs []Job, id string) (Job, bool) {
	for _, j := range jobs {
		if j.ID == id {
			return j, true
		}
	}
	return Job{}, false
}
