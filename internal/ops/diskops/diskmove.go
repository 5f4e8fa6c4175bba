package diskops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// A live disk move copies a disk of a running VM to a new image with
// QEMU's blockdev-mirror while the guest goes on writing, then pivots the
// disk's device onto the copy (job-complete once the job is "ready") and
// closes the old image. Until the pivot the guest runs on the source, so
// a cancel, a failure or a kill leaves it there untouched; after it the
// record follows (diskmove_recover.go finishes either way).

const opDiskMove operation.Kind = "disk-move"

// MoveOptions say where MoveDisk puts a disk: To, a new image file (with
// Format, default from its extension), or Spec, a whole disk (a file or
// RBD image) as `disk attach --spec` takes it.
type MoveOptions struct {
	To     string
	Format string
	Spec   *spec.Disk
	// Speed limits the copy, bytes per second (0: as fast as it goes).
	Speed int64
	// Progress, when set, sees the copy go.
	Progress func(MoveProgress)
}

// MoveProgress is one report of a move: QEMU's job status ("running",
// then "ready" once the copy caught up) and its progress in bytes (Total
// grows while the guest writes).
type MoveProgress struct {
	Disk    string        `json:"disk"`
	Status  string        `json:"status"`
	Done    int64         `json:"done_bytes"`
	Total   int64         `json:"total_bytes"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// MoveResult reports a move done.
type MoveResult struct {
	VM       string        `json:"vm"`
	Disk     string        `json:"disk"`
	From     string        `json:"from"`
	To       string        `json:"to"`
	Bytes    int64         `json:"bytes"`
	Duration time.Duration `json:"duration_ns"`
	// Note says what the user still has to do (update the VM's file), or
	// what was left behind (a source node QEMU would not close).
	Note string `json:"note"`
}

// moveIntent is a move's journal entry: enough for recovery to tell from
// QEMU which side the device is on, and to finish or undo.
type moveIntent struct {
	Disk   string    `json:"disk"`
	Source spec.Disk `json:"source"` // what the device runs on at the start
	Target spec.Disk `json:"target"`
	// FromFile: a disk of the VM's file (recorded in Applied.Moved, from
	// FileSource), else an attached one (its AttachedDisk rewritten).
	FromFile   bool   `json:"from_file,omitempty"`
	FileSource string `json:"file_source,omitempty"`
	Created    bool   `json:"created,omitempty"` // the move made the target file
	Job        string `json:"job"`
	// The target's parts in QEMU (nodes protocol first), its grants, and
	// the source's parts, closed after the pivot.
	Nodes         []string `json:"nodes"`
	Objects       []string `json:"objects,omitempty"`
	Rules         []string `json:"rules,omitempty"`
	SourceNodes   []string `json:"source_nodes"`
	SourceObjects []string `json:"source_objects,omitempty"`
}

// MoveDisk moves disk of the running VM name (see MoveOptions).
func (s *Service) MoveDisk(ctx context.Context, name, disk string, o MoveOptions) (MoveResult, error) {
	res := MoveResult{VM: name, Disk: disk}
	fail := func(err error) (MoveResult, error) {
		return res, vmerr.Wrap(name, fmt.Errorf("move disk %q: %w", disk, err))
	}
	lk, err := s.lock(ctx, name, string(opDiskMove))
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	v, err := s.env.View(name)
	if errors.Is(err, vmstore.ErrNotRunning) {
		return fail(errors.New("the VM is not running: start it, or copy the image and edit the file"))
	}
	if err != nil {
		return fail(err)
	}
	app := v.Applied
	src, fileSrc, err := movableDisk(v, disk)
	if err != nil {
		return fail(err)
	}
	if v.Tree.HasDisk(disk) {
		return fail(errors.New("it is in the VM's snapshots: remove its snapshots first (vmsup snapshot rm)"))
	}
	target, err := moveTarget(name, src, o)
	if err != nil {
		return fail(err)
	}
	res.From, res.To = vmstore.DiskSource(src), vmstore.DiskSource(target)
	if (target.Type == spec.DiskRBD || target.Type == spec.DiskISCSI) && !hostNetworked(v) {
		// Its unit was started without the host's network (no NIC, no
		// network disk): QEMU cannot reach the storage until a restart.
		return fail(fmt.Errorf("the VM's QEMU runs without the host's network (it booted with no NIC and no network disk), so it cannot reach %s: restart it with the disk in its file, or move to a file", target.Type))
	}
	if err := s.checkTarget(ctx, app, target); err != nil {
		return fail(err)
	}
	c, release, err := s.env.QMPSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	// A cancel from another command comes as a file (this one holds the
	// monitor): seen at the next progress poll.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	m := &diskMove{s: s, name: name, c: c, app: app, opts: o, start: time.Now(), stop: stop,
		cancelReq: moveCancelFile(s.paths(name), disk)}
	os.Remove(m.cancelReq)
	defer os.Remove(m.cancelReq)
	if m.in, err = s.newMoveIntent(ctx, name, c, src, target, fileSrc); err != nil {
		return fail(err)
	}
	op, err := s.k.Begin(ctx, name, opDiskMove, m.in)
	if err != nil {
		return fail(err)
	}
	m.op = op
	if _, err := steps.Run(ctx, name, m.steps(), op.After()); err != nil {
		if !m.pivoted {
			op.End() // undone by the steps' undos
		} // else: the device runs on the target: recovery records it
		if m.cancelled {
			return fail(fmt.Errorf("cancelled (vmsup disk move --cancel): it stays on %s", res.From))
		}
		return fail(steps.Cause(err))
	}
	op.End()
	res.Bytes, res.Duration, res.Note = m.bytes, time.Since(m.start), m.note
	s.env.Lifecycle(name, "disk-move", map[string]any{"disk": disk, "from": res.From, "to": res.To})
	return res, nil
}

// movableDisk finds disk in what the VM runs with (its file's disks, as
// moved, and the attached ones) and refuses what is not moved; fileSrc is
// the file's source of a disk of the file ("" for an attached one).
func movableDisk(v *vmstore.View, disk string) (d spec.Disk, fileSrc string, err error) {
	vd := v.Disk(disk)
	if vd == nil {
		return d, "", errors.New("the VM has no such disk")
	}
	d = vd.Disk
	if !vd.Attached {
		fileSrc = cmp.Or(vd.MovedFrom, vmstore.DiskSource(d))
	}
	switch {
	case d.IsCDROM() || d.ReadOnly:
		return d, "", errors.New("it is a CD-ROM or read-only: nothing is written to it, copy the image and edit the file instead")
	case d.Type != spec.DiskFile && d.Type != spec.DiskRBD:
		return d, "", fmt.Errorf("it is of type %s: moves are from image files and RBD images", d.Type)
	}
	return d, fileSrc, nil
}

// moveTarget is the disk as it will be: the source's device side (bus,
// serial, boot index) on the new image.
func moveTarget(vm string, src spec.Disk, o MoveOptions) (spec.Disk, error) {
	var t spec.Disk
	switch {
	case (o.To == "") == (o.Spec == nil):
		return t, errors.New("give exactly one of a target path and a target spec")
	case o.Spec != nil:
		t = *o.Spec
		if t.Name != src.Name && t.Name != "" {
			return t, fmt.Errorf("the target spec names disk %q, not %q", t.Name, src.Name)
		}
		t.Name = src.Name
	default:
		t = src
		t.Type, t.File, t.Format, t.Backing, t.Size = spec.DiskFile, o.To, o.Format, "", 0
		t.Pool, t.Image, t.Namespace, t.Snapshot, t.Monitors, t.CephConf, t.User, t.SecretFile = "", "", "", "", nil, "", "", ""
		d, err := spec.CheckDisk("--to", t, vm)
		if err != nil {
			return t, err
		}
		t = *d
	}
	t.Bus, t.Serial, t.BootIndex, t.Device, t.IOThread = src.Bus, src.Serial, src.BootIndex, src.Device, src.IOThread
	switch {
	case t.Type != spec.DiskFile && t.Type != spec.DiskRBD:
		return t, fmt.Errorf("the target is of type %s: a disk moves to an image file or an RBD image", t.Type)
	case t.ReadOnly:
		return t, errors.New("the target is read-only")
	case vmstore.DiskSource(t) == vmstore.DiskSource(src):
		return t, fmt.Errorf("the disk is already on %s", vmstore.DiskSource(t))
	}
	return t, nil
}

// checkTarget refuses a target file that exists or that the running VM
// could not open, and checks an RBD target as attach does.
func (s *Service) checkTarget(ctx context.Context, app *vmstore.Applied, t spec.Disk) error {
	if err := s.env.CheckDiskPaths(ctx, t); err != nil {
		return err
	}
	if t.Type != spec.DiskFile {
		probe := t
		probe.InitiatorName = t.InitiatorFor(app.UUID)
		return s.env.Tools().Check(ctx, probe)
	}
	if _, err := os.Lstat(t.File); err == nil {
		return fmt.Errorf("%s exists: the move creates its target, give a new path", t.File)
	}
	if t.Backing != "" {
		return errors.New("the target cannot have a backing image: the move copies the whole disk")
	}
	return s.env.Reachable(t.File)
}

// newMoveIntent names everything the move will put into QEMU and take out.
func (s *Service) newMoveIntent(ctx context.Context, name string, c *qmp.Conn, src, t spec.Disk, fileSrc string) (*moveIntent, error) {
	in := &moveIntent{Disk: src.Name, Source: src, Target: t, FromFile: fileSrc != "", FileSource: fileSrc,
		Job: "vmsup-move-" + src.Name, Created: t.Type == spec.DiskFile}
	top, err := qdev.DeviceNode(ctx, c, src.Name)
	if err != nil {
		return nil, err
	}
	sp, err := qdev.RunningParts(s.paths(name).Dir, src, top)
	if err != nil {
		return nil, err
	}
	in.SourceNodes, in.SourceObjects = qdev.PartNames(sp)
	tp, err := qemuargs.MoveTarget(t, qdev.MoveHost(s.paths(name).Dir, t))
	if err != nil {
		return nil, err
	}
	in.Nodes, in.Objects = qdev.PartNames(tp)
	return in, nil
}

// CancelDiskMove asks the move of disk in progress on VM name to cancel.
// The move's command holds the VM's lock and its monitor, so the request
// is a file it looks for at each progress poll; it then cancels its job
// (the device stays on the source) and takes the target out again.
func (s *Service) CancelDiskMove(ctx context.Context, name, disk string) error {
	fail := func(err error) error {
		return vmerr.Wrap(name, fmt.Errorf("cancel the move of disk %q: %w", disk, err))
	}
	op, err := s.k.Pending(name)
	if err != nil {
		return fail(err)
	}
	if op != nil {
		defer op.Close() // its own command ends it
	}
	if op == nil || op.Kind() != opDiskMove {
		return fail(errNoMove)
	}
	if in, err := operation.IntentOf[moveIntent](op); err != nil || in.Disk != disk {
		return fail(errNoMove)
	}
	if err := os.WriteFile(moveCancelFile(s.paths(name), disk), nil, 0o600); err != nil {
		return fail(err)
	}
	return nil
}

func moveCancelFile(p vmstore.Paths, disk string) string {
	return filepath.Join(p.Dir, "move-cancel-"+disk)
}

// errNoMove says no move job runs.
var errNoMove = errors.New("no move in progress")

// cancelMoveJob cancels job id without a pivot: a ready mirror with
// block-job-cancel (it concludes without error, the device stays on the
// source), one still copying with job-cancel. wait: until it concluded,
// then dismiss it.
func cancelMoveJob(ctx context.Context, c *qmp.Conn, id string, wait bool) error {
	jobs, err := c.QueryJobs(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(jobs, func(j qmp.Job) bool { return j.ID == id })
	if i < 0 {
		return errNoMove
	}
	switch j := jobs[i]; j.Status {
	case qmp.JobReady:
		err = c.BlockJobCancel(ctx, id, false)
	case qmp.JobConcluded, qmp.JobNull, qmp.JobAborting:
	default:
		err = c.JobCancel(ctx, id)
	}
	if err != nil || !wait {
		return err
	}
	_, _ = qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Status == qmp.JobConcluded }, nil)
	return c.JobDismiss(ctx, id)
}

// moveRules are the grants a target needs: its files, and its key.
func moveRules(ctx context.Context, p vmstore.Paths, t spec.Disk) ([]units.PathRule, error) {
	if t.Type == spec.DiskFile {
		return nil, nil // QEMU gets it as a descriptor (moveTargetFD)
	}
	rules, err := confine.DiskRules(ctx, t)
	if sec := qdev.MoveSecretFile(p.Dir, t); sec != "" {
		rules = append(rules, units.PathRule{Path: sec, Mode: "r"})
	}
	return rules, err
}

// hostNetworked reports whether the VM's unit runs in the host's network
// (units.Sandbox.HostNetwork at its start).
func hostNetworked(v *vmstore.View) bool {
	return len(v.Booted.NICs) > 0 || v.Booted.HasNetworkDisk() || slices.ContainsFunc(v.Disks, func(d vmstore.Disk) bool {
		return d.Type == spec.DiskRBD || d.Type == spec.DiskISCSI
	})
}
