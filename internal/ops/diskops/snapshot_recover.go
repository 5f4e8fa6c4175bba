package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/lifecycle/memstate"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
)

// A snapshot whose command died: a guest on its overlays keeps them (the
// snapshot is recorded: nothing the guest wrote since is lost); one still
// on its old images gets the overlays removed. Either way the guest is
// thawed and, if the snapshot paused it, resumed.

// snapFate is what becomes of a snapshot whose command died.
type snapFate uint8

const (
	snapRecorded  snapFate = iota + 1 // the tree has it: only the guest is settled
	snapKeep                          // QEMU runs the disks on the new overlays: recorded
	snapDrop                          // QEMU runs them on their old images: the overlays go
	snapUnmade                        // QEMU gone, an overlay never made: the overlays go
	snapRBDUnmade                     // QEMU gone, the RBD snapshots not all made: they go
	snapRecordOff                     // QEMU gone, all of it made: recorded
	snapAskAgain                      // QEMU's monitor could not be had: the journal stays
)

// note is what recovery says it did (the CLI shows it).
func (f snapFate) note() string {
	switch f {
	case snapRecorded:
		return "it was recorded"
	case snapKeep:
		return "the disks ran on the new overlays: recorded the snapshot"
	case snapDrop:
		return "the disks had not switched: removed the overlays"
	case snapUnmade:
		return "the overlays were not all made: removed them"
	case snapRBDUnmade:
		return "the RBD snapshots were not all made: removed them"
	case snapRecordOff:
		return "recorded the snapshot (the VM is off)"
	}
	return ""
}

// snapSeen is what recovery sees of a snapshot whose command died.
type snapSeen struct {
	recorded bool // the tree has its tag
	qemu     qemuSeen
	// onOverlays (QEMU answers): every disk's new overlay is linked onto
	// its base. overlaysMade (QEMU gone): every overlay file exists.
	onOverlays, overlaysMade bool
	files, rbd, memory       bool // it holds image files (overlays), RBD images, the guest's memory
	switched, rbdMade, saved bool // journaled: the switch, rbd and saved steps
}

// memoryTorn reports whether a snapshot's memory state is not whole: QEMU
// finished writing it once "saved", or the switch step (which saves it),
// was journaled. A torn one goes, and the snapshot is kept without it.
func memoryTorn(s snapSeen) bool { return !s.recorded && s.memory && !s.switched && !s.saved }

// decideSnapshot is what becomes of a snapshot whose command died.
func decideSnapshot(s snapSeen) snapFate {
	switch {
	case s.recorded:
		return snapRecorded
	case s.qemu == qemuAnswers:
		switched := s.onOverlays
		if !s.files { // RBD disks only: the switch step made their snapshots
			switched = s.switched
		}
		if switched {
			return snapKeep
		}
		return snapDrop
	case s.qemu == qemuGone:
		// Whether QEMU switched cannot be asked. Keeping the overlays is
		// right either way (an empty one reads as its base).
		switch {
		case !s.overlaysMade:
			return snapUnmade
		case s.rbd && !s.rbdMade && !s.switched:
			return snapRBDUnmade
		}
		return snapRecordOff
	}
	return snapAskAgain
}

// seeSnapshot is what recovery sees of snapshot in: the record (recorded),
// the journal (has), and QEMU (b when it answers).
func seeSnapshot(ctx context.Context, b blockState, qemu qemuSeen, in snapIntent, has func(operation.Step) bool, recorded bool) (snapSeen, error) {
	s := snapSeen{recorded: recorded, qemu: qemu, files: len(in.Layers) > 0, rbd: len(in.RBD) > 0, memory: in.Snap.Memory != "",
		switched: has(stepSnapSwitch), rbdMade: has(stepSnapRBD), saved: has(stepSaved)}
	switch {
	case recorded:
	case qemu == qemuAnswers:
		on, err := onOverlays(ctx, b, in.Layers)
		if err != nil {
			return s, err
		}
		s.onOverlays = on
	case qemu == qemuGone:
		s.overlaysMade = !slices.ContainsFunc(in.Layers, func(l snapshottree.Layer) bool { return !exists(l.Overlay.Path) })
	}
	return s, nil
}

// recoverSnapshot finishes or undoes a snapshot whose command died.
func (s *Service) recoverSnapshot(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[snapIntent](op)
	if err != nil {
		return "", err
	}
	tree, err := snapshottree.Load(s.paths(name).Snapshots())
	if err != nil {
		return "", err
	}
	recorded := tree.Find(in.Tag) != nil
	if memoryTorn(snapSeen{recorded: recorded, memory: in.Snap.Memory != "", switched: op.Has(stepSnapSwitch), saved: op.Has(stepSaved)}) {
		os.Remove(in.Snap.Memory)
		in.Snap.Memory = ""
	}
	c, qemu, release, qerr := s.session(ctx, name)
	defer release()
	seen, err := seeSnapshot(ctx, qemuBlocks{c}, qemu, in, op.Has, recorded)
	if err != nil {
		return "", err
	}
	fate := decideSnapshot(seen)
	var gerr error // the guest is settled first: thawed and resumed
	if c != nil {
		gerr = s.settleGuest(ctx, name, c, in, op.Has(stepFrozen))
	}
	switch fate {
	case snapKeep, snapRecordOff:
		gerr = errors.Join(s.recordTaken(name, in), gerr)
	case snapDrop:
		delOverlayNodes(ctx, c, in.Layers)
		_ = s.env.ReleasePaths(ctx, name, rulePaths(overlayRules(in.Layers))...)
		fallthrough
	case snapUnmade, snapRBDUnmade:
		removeLayerFiles(in.Layers)
		s.removeRBDSnaps(ctx, in)
	case snapAskAgain:
		return "", qerr
	}
	return fate.note(), gerr
}

func removeLayerFiles(layers []snapshottree.Layer) {
	for _, l := range layers {
		os.Remove(l.Overlay.Path)
	}
}

func (s *Service) recordTaken(name string, in snapIntent) error {
	p := s.paths(name)
	tree, err := snapshottree.Load(p.Snapshots())
	if err != nil {
		return err
	}
	if in.Snap.Quiesced == "" {
		in.Snap.Quiesced = "interrupted; recorded by recovery"
	}
	in.Snap.RBD = rbdSnaps(in)
	tree.Taken(in.Snap, in.Layers)
	return s.saveTree(name, tree)
}

// onOverlays reports whether every disk runs on its new overlay (linked
// onto its base by the transaction); none does after a failed one.
func onOverlays(ctx context.Context, b blockState, layers []snapshottree.Layer) (bool, error) {
	nodes, err := b.QueryNamedBlockNodes(ctx)
	if err != nil {
		return false, err
	}
	for _, l := range layers {
		i := slices.IndexFunc(nodes, func(n qmp.BlockNode) bool { return n.NodeName == qemuargs.OverlayNodeName(l.Overlay.Path) })
		if i < 0 || nodes[i].BackingFile == "" {
			return false, nil
		}
	}
	return len(layers) > 0, nil
}

// guestSeen is the guest of a snapshot whose command died.
type guestSeen struct {
	live, paused bool // the intent: it ran; the snapshot paused it (a memory save)
	frozen       bool // journaled: its filesystems were frozen
	// Asked only of a guest the snapshot paused: the memory save's status
	// ("" for no answer), and the run state (or why there is none).
	save   qmp.MigrationStatus
	run    qmp.RunState
	runErr error
}

// guestPlan is what recovery does to the guest of a live snapshot.
type guestPlan struct {
	cancelSave bool // a memory save still runs: cancelled first (the guest stays paused)
	resume     bool // the snapshot paused it, and it is paused still
	thaw       bool // its filesystems may be frozen: thawed (quiet without an agent)
	mustThaw   bool // a thaw that fails is an error: the snapshot froze them
}

// decideGuest settles a snapshot's guest: a save cancelled, a pause
// ended, a freeze thawed.
func decideGuest(g guestSeen) guestPlan {
	if !g.live {
		return guestPlan{}
	}
	p := guestPlan{thaw: true, mustThaw: g.frozen}
	if g.paused {
		p.cancelSave = g.save == qmp.MigrationActive || g.save == qmp.MigrationSetup
		p.resume = g.runErr == nil && g.run != qmp.RunRunning
	}
	return p
}

// seeGuest looks at the guest of snapshot in.
func seeGuest(ctx context.Context, r runStates, in snapIntent, frozen bool) guestSeen {
	g := guestSeen{live: in.Live, paused: in.Paused, frozen: frozen}
	if g.live && g.paused {
		if mi, err := r.QueryMigrate(ctx); err == nil {
			g.save = mi.Status
		}
		// Asked before a cancel: a save cancelled leaves a guest the
		// snapshot paused paused (QEMU resumes only one it found running).
		qs, err := r.QueryStatus(ctx)
		g.run, g.runErr = qs.Status, err
	}
	return g
}

// settleGuest does decideGuest's plan for the guest of snapshot in. A
// thaw that fails counts only if the snapshot had frozen it.
func (s *Service) settleGuest(ctx context.Context, name string, c *qmp.Conn, in snapIntent, frozen bool) error {
	g := seeGuest(ctx, c, in, frozen)
	p := decideGuest(g)
	rerr := g.runErr
	if p.cancelSave {
		_ = c.MigrateCancel(ctx)
		_ = memstate.Wait(ctx, c, nil)
		memstate.Reset(ctx, c) // a dead save's mapped-ram and fd set
	}
	if p.resume {
		if err := c.Cont(ctx); err != nil {
			rerr = fmt.Errorf("resume: %w", err)
		}
	}
	if p.thaw {
		if err := s.thawGuest(ctx, name, c); err != nil && p.mustThaw {
			return errors.Join(rerr, err)
		}
	}
	return rerr
}
