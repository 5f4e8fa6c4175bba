package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/diskfds"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// diskMove is one move's steps. Every undo is a no-op once the device is
// on the target (pivoted): from there the move is finished, never undone.
type diskMove struct {
	s       *Service
	name    string
	c       *qmp.Conn
	app     *vmstore.Applied
	op      *operation.Op
	in      *moveIntent
	opts    MoveOptions
	start   time.Time
	prep    storage.Prepared
	rules   []units.PathRule
	pivoted bool
	bytes   int64
	note    string
	// cancelReq is the file CancelDiskMove writes; stop cancels the
	// move's context (before the pivot only), cancelled says it did.
	cancelReq string
	stop      func()
	pivoting  bool
	cancelled bool
}

// stepMoveJobComplete is journaled before the move's job is completed:
// from then on the target may hold writes the source lacks.
const stepMoveJobComplete operation.Step = "job-complete"

func (m *diskMove) steps() []step {
	return []step{
		{Name: "create", Do: m.create, Undo: m.removeTarget},
		{Name: "confine", Do: m.confine, Undo: m.release},
		{Name: "nodes", Do: m.addNodes, Undo: m.delNodes},
		{Name: "mirror", Do: m.mirror, Undo: m.cancel},
		{Name: "ready", Do: m.waitReady},
		{Name: "pivot", Do: m.pivot},
		{Name: "record", Do: m.record},
		{Name: "source", Do: m.closeSource},
	}
}

// create makes the target file (the source's guest-visible size, owner
// only), or copies an RBD target's key for QEMU.
func (m *diskMove) create(ctx context.Context) error {
	t := m.in.Target
	if t.Type != spec.DiskFile {
		var err error
		m.prep, err = m.s.env.Tools().Prepare(ctx, t, m.s.paths(m.name).Dir)
		return err
	}
	nodes, err := m.c.QueryNamedBlockNodes(ctx)
	if err != nil {
		return err
	}
	top := m.in.SourceNodes[len(m.in.SourceNodes)-1]
	i := slices.IndexFunc(nodes, func(n qmp.BlockNode) bool { return n.NodeName == top })
	if i < 0 || nodes[i].Image.VirtualSize <= 0 {
		return fmt.Errorf("QEMU does not say the size of node %s", top)
	}
	return m.s.env.Tools().Create(ctx, t.File, t.Format, nodes[i].Image.VirtualSize, "", "")
}

func (m *diskMove) removeTarget(context.Context) {
	if m.pivoted {
		return
	}
	if m.in.Target.Type == spec.DiskFile {
		os.Remove(m.in.Target.File)
	}
	m.prep.Undo()
}

// confine grants QEMU the target, journaled first so that a kill between
// the two leaves nothing unknown.
func (m *diskMove) confine(ctx context.Context) (err error) {
	if m.rules, err = moveRules(ctx, m.s.paths(m.name), m.in.Target); err != nil {
		return err
	}
	m.in.Rules = rulePaths(m.rules)
	if err := m.op.SetIntent(m.in); err != nil {
		return err
	}
	return m.s.env.ConfinePaths(ctx, m.name, m.rules...)
}

func (m *diskMove) release(ctx context.Context) {
	if !m.pivoted {
		_ = m.s.env.ReleasePaths(ctx, m.name, m.in.Rules...)
	}
}

func (m *diskMove) addNodes(ctx context.Context) error {
	p, err := qemuargs.MoveTarget(m.in.Target, qdev.MoveHost(m.s.paths(m.name).Dir, m.in.Target))
	if err != nil {
		return err
	}
	if m.in.Target.Type == spec.DiskFile {
		if p.Blockdevs[0].Filename, err = m.targetFD(ctx); err != nil {
			return err
		}
	}
	for _, o := range p.Objects {
		if err := m.c.ObjectAdd(ctx, o); err != nil {
			m.delNodes(ctx)
			return fmt.Errorf("object-add %s: %w", o.ID, err)
		}
	}
	for _, b := range p.Blockdevs {
		if err := m.c.BlockdevAdd(ctx, b); err != nil {
			m.delNodes(ctx)
			return fmt.Errorf("blockdev-add %s: %w", b.NodeName, err)
		}
	}
	return nil
}

// targetFD opens a file target beneath its place and passes it to QEMU
// (its own fd set, both access modes, named as the disk's image): QEMU
// opens no target by name and is granted none. It returns the file QEMU
// opens.
func (m *diskMove) targetFD(ctx context.Context) (string, error) {
	t := m.in.Target
	o, err := m.s.env.Places().OpenDisk(ctx, t)
	if err != nil {
		return "", err
	}
	defer o.Close()
	set, err := diskfds.PassFile(ctx, m.c, m.in.Disk, t.File, o.Levels[0].File, qemuargs.CacheDirect(t))
	if err != nil {
		return "", fmt.Errorf("pass %s to QEMU: %w", t.File, err)
	}
	return fmt.Sprintf("/dev/fdset/%d", set), nil
}

func (m *diskMove) delNodes(ctx context.Context) {
	if !m.pivoted {
		_ = qdev.DelParts(ctx, m.c, m.in.Nodes, m.in.Objects)
		if m.in.Target.Type == spec.DiskFile {
			_ = qdev.RemoveFileSets(ctx, m.c, m.in.Target.File)
		}
	}
}

func (m *diskMove) mirror(ctx context.Context) error {
	no := false
	return m.c.BlockdevMirror(ctx, qmp.Mirror{JobID: m.in.Job, Device: m.in.SourceNodes[len(m.in.SourceNodes)-1],
		Target: m.in.Nodes[len(m.in.Nodes)-1], Sync: "full", Speed: m.opts.Speed, AutoDismiss: &no})
}

func (m *diskMove) cancel(ctx context.Context) {
	if !m.pivoted {
		_ = cancelMoveJob(ctx, m.c, m.in.Job, true)
	}
}

func (m *diskMove) report(j qmp.Job) {
	if !m.pivoting && !m.cancelled && exists(m.cancelReq) {
		m.cancelled = true
		m.stop()
	}
	m.bytes = j.CurrentProgress
	if m.opts.Progress != nil {
		m.opts.Progress(MoveProgress{Disk: m.in.Disk, Status: string(j.Status), Done: j.CurrentProgress, Total: j.TotalProgress,
			Elapsed: time.Since(m.start)})
	}
}

// waitReady waits until the copy caught up: from then on the guest's
// writes go to both images.
func (m *diskMove) waitReady(ctx context.Context) error {
	_, err := qmp.WaitJob(ctx, m.c, m.in.Job, func(j qmp.Job) bool { return j.Status == qmp.JobReady }, m.report)
	return err
}

// pivot completes the job (the device switches to the target) and checks
// that it did: a job cancelled from outside concludes without one.
func (m *diskMove) pivot(ctx context.Context) error {
	// Journaled before: from job-complete on, the target may hold writes
	// the source lacks (recovery of a VM whose QEMU died too keeps it).
	m.pivoting = true
	m.op.Step(stepMoveJobComplete)
	if err := m.c.JobComplete(ctx, m.in.Job); err != nil {
		return fmt.Errorf("job-complete: %w", err)
	}
	_, err := qmp.WaitJob(ctx, m.c, m.in.Job, func(j qmp.Job) bool { return j.Status == qmp.JobConcluded }, m.report)
	_ = m.c.JobDismiss(context.WithoutCancel(ctx), m.in.Job)
	on, qerr := onTarget(ctx, m.c, m.in)
	if qerr != nil {
		// Unknown: leave it all to recovery, which asks again.
		m.pivoted = true
		return qerr
	}
	m.pivoted = on
	if !on {
		return errors.Join(errors.New("the job ended without switching the disk (cancelled?): it stays on its image"), err)
	}
	return nil
}

// onTarget reports whether the device runs on the target's node.
func onTarget(ctx context.Context, c *qmp.Conn, in *moveIntent) (bool, error) {
	top, err := qdev.DeviceNode(ctx, c, in.Disk)
	if err != nil {
		return false, err
	}
	return top == in.Nodes[len(in.Nodes)-1], nil
}

// record makes the VM's record follow: an attached disk's spec is
// rewritten; a disk of the file gets an override the next boot uses.
func (m *diskMove) record(context.Context) error {
	m.note = recordMove(m.app, m.in)
	if err := m.s.env.State().RewriteApplied(m.app); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	return nil
}

func recordMove(app *vmstore.Applied, in *moveIntent) (note string) {
	if !in.FromFile {
		for i := range app.Attached {
			if app.Attached[i].Disk.Name == in.Disk {
				app.Attached[i].Disk = in.Target
			}
		}
		return ""
	}
	to := vmstore.DiskSource(in.Target)
	if to == in.FileSource {
		delete(app.Moved, in.Disk) // back where the file says
		return ""
	}
	if app.Moved == nil {
		app.Moved = map[string]vmstore.MovedDisk{}
	}
	app.Moved[in.Disk] = vmstore.MovedDisk{From: in.FileSource, Disk: in.Target}
	return fmt.Sprintf("the VM's file still names %s for disk %q: the next up boots from %s while it does; update the file to name it", in.FileSource, in.Disk, to)
}

// closeSource closes the old image (its nodes, key, and the bases' nodes
// and fd sets of one passed as descriptors) and takes back QEMU's grants
// to it. The move is done whatever happens here: a failure
// is a note, and the old image is left as it is either way.
func (m *diskMove) closeSource(ctx context.Context) error {
	if err := m.s.closeMoveSource(ctx, m.name, m.c, m.in); err != nil {
		m.note = strings.TrimSpace(m.note + "; the old image may still be open: " + err.Error())
		m.s.env.Opts().Logger.Warn("disk move: close the source", "vm", m.name, "disk", m.in.Disk, "err", err)
	}
	return nil
}

func (s *Service) closeMoveSource(ctx context.Context, name string, c *qmp.Conn, in *moveIntent) error {
	err := qdev.DelParts(ctx, c, in.SourceNodes, in.SourceObjects)
	// The source's bases and fd sets, if it was passed as descriptors.
	err = errors.Join(err, qdev.RemoveChain(ctx, c, in.Disk, in.Target.File))
	rules, _ := confine.DiskRules(ctx, in.Source)
	paths := rulePaths(rules)
	if _, sec := storage.HostFiles(s.paths(name).Dir, in.Source); sec != "" && !in.Target.NeedsSecret() {
		paths = append(paths, sec)
	}
	// Never the target's own files (a source and target sharing a base).
	paths = slices.DeleteFunc(paths, func(p string) bool { return slices.Contains(in.Rules, p) })
	return errors.Join(err, s.env.ReleasePaths(ctx, name, paths...))
}
