package diskops

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/diskfds"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Snapshots are external (internal/vm/snapshottree keeps the tree): a snapshot
// freezes the image each writable disk runs on and puts a new qcow2
// overlay on it, all disks in one QMP transaction, so they are consistent
// with each other. The next start boots on the overlays (startplan.Boot).

const opSnapshot operation.Kind = "snapshot"

// Steps of a snapshot in the journal that its recovery reads.
const (
	stepSnapSwitch operation.Step = "switch" // the disks run on the overlays (the transaction, or the memory save's)
	stepSnapRBD    operation.Step = "rbd"    // the RBD snapshots are made
	stepFreezing   operation.Step = "freezing"
	stepFrozen     operation.Step = "frozen" // the guest's filesystems are frozen
	stepPaused     operation.Step = "paused" // the guest is paused for the memory save
	stepSaved      operation.Step = "saved"  // the memory state is whole
)

// SnapshotOptions say what a snapshot keeps.
type SnapshotOptions struct {
	// Memory saves the guest's RAM and device state too (a migration into
	// a file vmsup opens and passes to QEMU as a descriptor): a revert
	// resumes the guest where it was.
	Memory bool
	// Progress, when set, sees the memory save go (bytes done, total).
	Progress func(done, total int64)
}

// SnapshotResult reports a snapshot taken.
type SnapshotResult struct {
	VM, Tag string
	Disks   []string // the disks it holds
	Memory  string   // the memory state file; "" for disk-only
	// Quiesced says how the guest's data was made consistent.
	Quiesced string
	// Pause is how long the guest was frozen or paused for it: what the
	// guest sees of a snapshot (0 for a VM that was not running).
	Pause time.Duration
	Live  bool
}

// snapIntent is a snapshot's journal entry: enough to finish it (record
// it) or undo it (drop the overlays) after a kill.
type snapIntent struct {
	Tag    string                `json:"tag"`
	Layers []snapshottree.Layer  `json:"layers"`
	Snap   snapshottree.Snapshot `json:"snapshot"`
	Live   bool                  `json:"live"`
	Disks  []spec.Disk           `json:"disks"`         // as QEMU opens them (cache, aio)
	RBD    []spec.Disk           `json:"rbd,omitempty"` // snapshotted by Ceph
	// Paused: the snapshot paused the guest (a memory save); recovery
	// resumes it.
	Paused bool `json:"paused,omitempty"`
}

// Snapshot takes snapshot tag of VM name, running or shut off.
func (s *Service) Snapshot(ctx context.Context, name, tag string, o SnapshotOptions) (SnapshotResult, error) {
	res := SnapshotResult{VM: name, Tag: tag}
	fail := func(err error) (SnapshotResult, error) {
		return res, vmerr.Wrap(name, fmt.Errorf("snapshot %q: %w", tag, err))
	}
	lk, err := s.lock(ctx, name, string(opSnapshot))
	if err != nil {
		return res, err
	}
	defer lk.Unlock()
	v, err := s.env.View(name)
	stopped := errors.Is(err, vmstore.ErrNotRunning)
	if err != nil && !stopped {
		return fail(err)
	}
	app, tree := v.Applied, v.Tree
	res.Live = !stopped
	if o.Memory {
		if stopped {
			return fail(errors.New("--memory needs a running VM (a VM that is off has no memory to keep)"))
		}
		if err := memorySnapshottable(app); err != nil {
			return fail(err)
		}
	}
	disks, err := s.snapshotDisks(v)
	if err != nil {
		return fail(err)
	}
	var layers []snapshottree.Layer
	if len(disks.files) > 0 || len(disks.rbd) == 0 {
		if layers, err = tree.PlanTake(tag, disks.files, exists); err != nil {
			return fail(err)
		}
	} else if err := tree.CheckTag(tag); err != nil {
		return fail(err)
	}
	in := snapIntent{Tag: tag, Layers: layers, Live: !stopped, Disks: disks.specs, RBD: disks.rbd,
		Snap: snapshottree.Snapshot{Tag: tag, Created: time.Now().UTC()}}
	if o.Memory {
		in.Snap.Memory, in.Snap.Devices, in.Snap.Machine = s.paths(name).SnapshotState(tag), devicesOf(app), app.Machine
	}
	op, err := s.k.Begin(ctx, name, opSnapshot, in)
	if err != nil {
		return fail(err)
	}
	tk := &snapTake{s: s, name: name, in: &in, op: op, opts: o}
	if !stopped {
		c, release, err := s.env.QMPSession(ctx, name)
		if err != nil {
			op.End()
			return fail(err)
		}
		defer release()
		tk.c = c
	}
	if _, err := steps.Run(ctx, name, tk.steps(), op.After()); err != nil {
		if !tk.switched {
			op.End() // undone by the steps' undos
		} // else: the VM runs on the overlays: recovery records them
		return fail(steps.Cause(err))
	}
	op.End()
	for _, l := range layers {
		res.Disks = append(res.Disks, l.Disk)
	}
	for _, d := range disks.rbd {
		res.Disks = append(res.Disks, d.Name)
	}
	res.Memory, res.Quiesced, res.Pause = in.Snap.Memory, in.Snap.Quiesced, tk.pause
	s.env.Lifecycle(name, "snapshot", map[string]any{"tag": tag, "memory": o.Memory, "pause_ms": tk.pause.Milliseconds()})
	return res, nil
}

// SnapshotTree is VM name's snapshot tree (empty when it has none).
func (s *Service) SnapshotTree(name string) (*snapshottree.Tree, error) {
	if err := spec.ValidName(name); err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	if _, err := os.Stat(s.paths(name).Records); err != nil {
		return nil, s.env.NotFound(name)
	}
	t, err := snapshottree.Load(s.paths(name).Snapshots())
	if err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	t.Name = name
	return t, nil
}

// memorySnapshottable refuses a memory snapshot of a VM whose devices the
// next boot would not recreate (live-only changes).
func memorySnapshottable(app *vmstore.Applied) error {
	switch {
	case len(app.AttachedNICs) > 0:
		return errors.New("--memory: the VM has NICs attached in this run, which a restore would not have; snapshot without --memory, or restart it first")
	case len(app.AttachedHostDevs) > 0:
		return errors.New("--memory: the VM has host devices attached (their state cannot be saved)")
	case app.Resized != nil:
		return errors.New("--memory: the VM's vCPUs or memory were changed in this run; restart it first")
	case app.Replugged:
		return errors.New("--memory: apply re-plugged devices in this run; restart it first")
	case app.MigratedFrom != "":
		return errors.New("--memory: the VM came in by migration; restart it first")
	}
	return nil
}

// devicesOf identifies the devices a memory state belongs to: the spec
// the VM runs (the file's disks as named there: a revert opens new
// overlays on them) and the disks it boots with beyond it. Not the
// generation: a restart or a revert with the same spec makes the same
// devices, and the snapshot reverts again and again.
func devicesOf(app *vmstore.Applied) string {
	h := sha256.New()
	h.Write(app.Spec)
	for _, a := range app.Attached {
		h.Write(vmstore.Canonical(&spec.VM{Disks: []spec.Disk{a.Disk}}))
	}
	return "devices:" + hex.EncodeToString(h.Sum(nil))
}

// sameDevices reports whether a memory state taken with devices fits the
// VM recorded in app (fingerprints of before devicesOf hashed the spec
// were "genN:SPEC", with the start's generation).
func sameDevices(devices string, app *vmstore.Applied) bool {
	if strings.HasPrefix(devices, "gen") {
		return devices == fmt.Sprintf("gen%d:%x", app.Generation, app.Spec)
	}
	return devices == devicesOf(app)
}

// snapshotDisks lists the VM's disks a snapshot holds (every writable
// image file; CD-ROMs are media, not state) and refuses the kinds it
// cannot hold yet.
func (s *Service) snapshotDisks(v *vmstore.View) (snapDisks, error) {
	var out snapDisks
	for _, vd := range v.Disks {
		d := vd.Disk
		if d.IsCDROM() {
			continue
		}
		switch {
		case d.ReadOnly:
			return out, fmt.Errorf("disk %q is read-only: a snapshot could not hold it consistently with the others (make it a CD-ROM, or writable)", d.Name)
		case d.Type == spec.DiskRBD && d.Snapshot != "":
			return out, fmt.Errorf("disk %q opens RBD snapshot %q, read-only: make it read_only", d.Name, d.Snapshot)
		case d.Type == spec.DiskRBD:
			out.rbd = append(out.rbd, d) // Ceph keeps its snapshots
			continue
		case d.Type != spec.DiskFile:
			return out, fmt.Errorf("disk %q is of type %s: snapshots hold image files (qcow2, raw) and RBD images only so far", d.Name, d.Type)
		}
		dir := filepath.Dir(d.File)
		if in, err := s.env.Confiner().InImageDirs(d.File); err != nil || !in {
			// A running QEMU can open new files only there (its unit's
			// mount namespace binds the image directories).
			dir = s.env.Opts().ImageDirs[0]
		}
		out.files = append(out.files, snapshottree.Disk{Name: d.Name, Own: snapshottree.Image{Path: d.File, Format: d.Format}, OverlayDir: dir})
		out.specs = append(out.specs, d)
	}
	return out, nil
}

// snapDisks are the disks a snapshot holds: image files (each gets an
// overlay; specs as QEMU opens them) and RBD images (an RBD snapshot each).
type snapDisks struct {
	files []snapshottree.Disk
	specs []spec.Disk
	rbd   []spec.Disk
}

// snapTake is one snapshot's steps.
type snapTake struct {
	s        *Service
	name     string
	in       *snapIntent
	op       *operation.Op
	opts     SnapshotOptions
	c        *qmp.Conn // nil: the VM is off
	switched bool      // the disks run on the overlays
	pause    time.Duration
	frozeAt  time.Time // when the guest was asked to freeze
}

func (t *snapTake) steps() []step {
	list := []step{{Name: "overlays", Do: t.createOverlays, Undo: t.removeOverlays}}
	if t.c != nil {
		list = append(list,
			step{Name: "nodes", Do: t.addNodes, Undo: t.delNodes},
			step{Name: string(stepSnapSwitch), Do: t.switchDisks})
	} else if len(t.in.RBD) > 0 {
		list = append(list, step{Name: string(stepSnapRBD), Do: t.createRBD, Undo: t.removeRBD})
	}
	return append(list, step{Name: "record", Do: t.record})
}

func (t *snapTake) createOverlays(ctx context.Context) error {
	for _, l := range t.in.Layers {
		size, err := t.virtualSize(ctx, l.Base)
		if err != nil {
			return fmt.Errorf("disk %q: %w", l.Disk, err)
		}
		if err := os.MkdirAll(filepath.Dir(l.Overlay.Path), 0o711); err != nil {
			return err
		}
		if err := t.s.env.Tools().CreateOverlay(ctx, l.Overlay.Path, l.Base.Path, l.Base.Format, size); err != nil {
			return fmt.Errorf("disk %q: %w", l.Disk, err)
		}
	}
	return nil
}

// virtualSize is the guest-visible size of image: QEMU's view while it
// runs (the image is locked), qemu-img's otherwise.
func (t *snapTake) virtualSize(ctx context.Context, im snapshottree.Image) (int64, error) {
	if t.c != nil {
		n, err := qdev.FindNode(ctx, t.c, im.Path)
		if err != nil {
			return 0, err
		}
		return n.Image.VirtualSize, nil
	}
	info, err := t.s.env.Tools().Info(ctx, im.Path, im.Format)
	return info.VirtualSize, err
}

// removeOverlays and the other undos do nothing once the disks run on the
// overlays (switched): QEMU writes them, recovery records the snapshot.
func (t *snapTake) removeOverlays(context.Context) {
	if t.switched {
		return
	}
	for _, l := range t.in.Layers {
		os.Remove(l.Overlay.Path)
	}
}

// overlayRules are the grants a snapshot of an earlier vmsup made (its
// overlays were opened by name): a recovery of its journal takes them back.
func overlayRules(layers []snapshottree.Layer) []units.PathRule {
	rules := make([]units.PathRule, len(layers))
	for i, l := range layers {
		rules[i] = units.PathRule{Path: l.Overlay.Path, Mode: "rwk"}
	}
	return rules
}

// addNodes adds each overlay's nodes on a descriptor of it (its own fd
// set, both access modes: QEMU writes it, and a later snapshot or commit
// reopens it): QEMU opens no overlay by name, and is granted none.
func (t *snapTake) addNodes(ctx context.Context) error {
	for i, l := range t.in.Layers {
		if err := t.addOverlay(ctx, t.in.Disks[i], l); err != nil {
			return fmt.Errorf("disk %q: overlay: %w", l.Disk, err)
		}
	}
	return nil
}

func (t *snapTake) addOverlay(ctx context.Context, d spec.Disk, l snapshottree.Layer) error {
	o, err := t.s.env.Places().OpenDisk(ctx, spec.Disk{Name: l.Disk, Type: spec.DiskFile, File: l.Overlay.Path, Format: spec.FormatQcow2})
	if err != nil {
		return err
	}
	defer o.Close()
	set, err := diskfds.PassFile(ctx, t.c, l.Disk, l.Overlay.Path, o.Levels[0].File, qemuargs.CacheDirect(d))
	if err != nil {
		return err
	}
	proto, format := qemuargs.Overlay(d, l.Overlay.Path)
	proto.Filename = fmt.Sprintf("/dev/fdset/%d", set)
	if err = t.c.BlockdevAdd(ctx, proto); err == nil {
		if err = t.c.BlockdevAdd(ctx, format); err != nil {
			_ = t.c.BlockdevDel(ctx, proto.NodeName)
		}
	}
	if err != nil {
		_ = t.c.RemoveFD(context.WithoutCancel(ctx), set, nil)
	}
	return err
}

func (t *snapTake) delNodes(ctx context.Context) {
	if !t.switched {
		delOverlayNodes(ctx, t.c, t.in.Layers)
	}
}

func delOverlayNodes(ctx context.Context, c *qmp.Conn, layers []snapshottree.Layer) {
	if c == nil {
		return // QEMU is gone, and its nodes and descriptors with it
	}
	for _, l := range layers {
		_ = c.BlockdevDel(ctx, qemuargs.OverlayNodeName(l.Overlay.Path))
		_ = c.BlockdevDel(ctx, qemuargs.OverlayFileNodeName(l.Overlay.Path))
		_ = qdev.RemoveFileSets(ctx, c, l.Overlay.Path)
	}
}

// switchDisks puts every disk on its overlay in one transaction, with the
// guest quiet: paused for a memory snapshot (the state is saved while it
// is), else its filesystems frozen by the guest agent if it answers.
func (t *snapTake) switchDisks(ctx context.Context) error {
	var actions []qmp.TransactionAction
	for _, l := range t.in.Layers {
		n, err := qdev.FindNode(ctx, t.c, l.Base.Path)
		if err != nil {
			return fmt.Errorf("disk %q: %w", l.Disk, err)
		}
		actions = append(actions, qmp.SnapshotAction(n.NodeName, qemuargs.OverlayNodeName(l.Overlay.Path)))
	}
	qs, err := t.c.QueryStatus(ctx)
	if err != nil {
		return err
	}
	t.in.Snap.Running = qs.Running
	if err := t.op.SetIntent(t.in); err != nil {
		return err
	}
	if t.opts.Memory {
		return t.withPause(ctx, qs.Running, actions)
	}
	// The guest-visible part: from the freeze to the thaw (the
	// transaction alone without an agent).
	thaw := t.freeze(ctx)
	if t.frozeAt.IsZero() {
		t.frozeAt = time.Now()
	}
	err = t.switchAll(ctx, qs.Running, actions)
	terr := thaw()
	t.pause = time.Since(t.frozeAt)
	if err != nil {
		return errors.Join(fmt.Errorf("transaction: %w", err), terr)
	}
	t.switched = true
	return terr
}

// record writes the snapshot into the tree: from here on it exists.
func (t *snapTake) record(context.Context) error {
	p := t.s.paths(t.name)
	tree, err := snapshottree.Load(p.Snapshots())
	if err != nil {
		return err
	}
	if t.in.Snap.Quiesced == "" {
		t.in.Snap.Quiesced = "VM off"
	}
	t.in.Snap.RBD = rbdSnaps(*t.in)
	tree.Taken(t.in.Snap, t.in.Layers)
	return t.s.saveTree(t.name, tree)
}

// saveTree records the VM's snapshot tree, through the record writer that
// has the operation's reserve for a full filesystem.
func (s *Service) saveTree(name string, tree *snapshottree.Tree) error {
	p := s.paths(name)
	return tree.SaveWith(p.Snapshots(), p.WriteRecord)
}
