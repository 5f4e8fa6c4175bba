package diskops

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// The steps each kind of snapshot journals, in order (the record step
// ends it: the tree has it from there).
var (
	snapLiveSteps   = []operation.Step{"overlays", "nodes", stepFreezing, stepFrozen, stepSnapSwitch}
	snapMemorySteps = []operation.Step{"overlays", "nodes", stepPaused, stepSaved, stepSnapSwitch}
	snapOffSteps    = []operation.Step{"overlays", stepSnapRBD}
)

// snapQEMU is one thing recovery can find of a snapshot's QEMU.
type snapQEMU struct {
	name     string
	seen     qemuSeen
	on, made bool // the disks on the overlays (answers); the overlays made (gone)
}

var (
	qemuOn      = snapQEMU{name: "QEMU on the overlays", seen: qemuAnswers, on: true}
	qemuOld     = snapQEMU{name: "QEMU on the old images", seen: qemuAnswers}
	qemuMade    = snapQEMU{name: "QEMU gone, the overlays made", seen: qemuGone, made: true}
	qemuUnmade  = snapQEMU{name: "QEMU gone, an overlay missing", seen: qemuGone}
	qemuBusy    = snapQEMU{name: "QEMU's monitor not to be had", seen: qemuUnknown}
	allSnapQEMU = []snapQEMU{qemuOn, qemuOld, qemuMade, qemuUnmade, qemuBusy}
)

// TestDecideSnapshot: a snapshot killed after each of its steps, against
// each thing recovery can find. Recorded, it stays. Of image files, QEMU
// says whether the disks switched, whatever the journal (so the overlays
// are kept exactly when the guest writes them); with QEMU gone, overlays
// all made are kept. RBD disks have no overlay to ask about: the journal's
// switch and rbd steps say whether their snapshots were made.
func TestDecideSnapshot(t *testing.T) {
	type row struct {
		kind  string
		steps []operation.Step
		files bool
		rbd   bool
		q     snapQEMU
		want  snapFate
	}
	var rows []row
	// Image files: QEMU, or the files, decide at every kill point (with
	// RBD disks beside them, the switch step says whether their snapshots
	// were made).
	byQEMU := map[snapQEMU]snapFate{qemuOn: snapKeep, qemuOld: snapDrop, qemuMade: snapRecordOff, qemuUnmade: snapUnmade, qemuBusy: snapAskAgain}
	for _, k := range []struct {
		kind  string
		steps []operation.Step
		rbd   bool
	}{{"live", snapLiveSteps, false}, {"memory", snapMemorySteps, false}, {"live with RBD", snapLiveSteps, true}} {
		for n := range len(k.steps) + 1 {
			for _, q := range allSnapQEMU {
				want := byQEMU[q]
				if k.rbd && q == qemuMade && n < len(k.steps) {
					want = snapRBDUnmade // QEMU gone before the switch made the RBD snapshots
				}
				rows = append(rows, row{k.kind, k.steps[:n], true, k.rbd, q, want})
			}
		}
	}
	for n := range 2 { // off, image files only: the overlays decide
		rows = append(rows, row{"off", snapOffSteps[:n], true, false, qemuMade, snapRecordOff},
			row{"off", snapOffSteps[:n], true, false, qemuUnmade, snapUnmade})
	}
	rows = append(rows,
		// Off with RBD disks: their snapshots, once the rbd step is journaled.
		row{"off with RBD", nil, true, true, qemuMade, snapRBDUnmade},
		row{"off with RBD", snapOffSteps[:1], true, true, qemuMade, snapRBDUnmade},
		row{"off with RBD", snapOffSteps[:1], true, true, qemuUnmade, snapUnmade},
		row{"off with RBD", snapOffSteps, true, true, qemuMade, snapRecordOff},
		row{"off, RBD only", snapOffSteps[:1], false, true, qemuMade, snapRBDUnmade},
		row{"off, RBD only", snapOffSteps, false, true, qemuMade, snapRecordOff},
		// Running, RBD only: the switch step made their snapshots.
		row{"live, RBD only", snapLiveSteps[:2], false, true, qemuOld, snapDrop},
		row{"live, RBD only", snapLiveSteps[:4], false, true, qemuOld, snapDrop},
		row{"live, RBD only", snapLiveSteps, false, true, qemuOld, snapKeep},
		row{"live, RBD only", snapLiveSteps[:4], false, true, qemuMade, snapRBDUnmade},
		row{"live, RBD only", snapLiveSteps, false, true, qemuMade, snapRecordOff},
		row{"live, RBD only", snapLiveSteps, false, true, qemuBusy, snapAskAgain},
	)
	for _, r := range rows {
		has := journal(r.steps...)
		s := snapSeen{qemu: r.q.seen, onOverlays: r.q.on, overlaysMade: r.q.made || !r.files, files: r.files, rbd: r.rbd,
			switched: has(stepSnapSwitch), rbdMade: has(stepSnapRBD), saved: has(stepSaved)}
		if got := decideSnapshot(s); got != r.want {
			t.Errorf("%s, killed after %v, %s: %d %q, want %d %q", r.kind, r.steps, r.q.name, got, got.note(), r.want, r.want.note())
		}
		s.recorded = true
		if got := decideSnapshot(s); got != snapRecorded {
			t.Errorf("%s, recorded, %s: %d %q", r.kind, r.q.name, got, got.note())
		}
	}
	t.Logf("%d cases", 2*len(rows))
}

// TestMemoryTorn: a memory state is kept once QEMU finished writing it
// (the saved step, or the switch step after it), and only then.
func TestMemoryTorn(t *testing.T) {
	for n := range len(snapMemorySteps) + 1 {
		has := journal(snapMemorySteps[:n]...)
		s := snapSeen{memory: true, switched: has(stepSnapSwitch), saved: has(stepSaved)}
		want := n < slices.Index(snapMemorySteps, stepSaved)+1
		if got := memoryTorn(s); got != want {
			t.Errorf("killed after %v: torn %v, want %v", snapMemorySteps[:n], got, want)
		}
		s.recorded = true
		if memoryTorn(s) {
			t.Errorf("killed after %v, recorded: the memory state goes", snapMemorySteps[:n])
		}
	}
	if memoryTorn(snapSeen{}) {
		t.Error("a snapshot without memory has a torn one")
	}
}

// TestDecideGuest: the guest of a live snapshot is thawed (a failed thaw
// counts only if the snapshot froze it); one the snapshot paused for its
// memory save has the save cancelled while it runs, and is resumed unless
// it runs (or its state cannot be had).
func TestDecideGuest(t *testing.T) {
	errStatus := errors.New("query-status: timeout")
	for _, c := range []struct {
		name string
		g    guestSeen
		want guestPlan
	}{
		{"off", guestSeen{}, guestPlan{}},
		{"off, frozen in the journal", guestSeen{frozen: true}, guestPlan{}},
		{"live", guestSeen{live: true}, guestPlan{thaw: true}},
		{"live, frozen", guestSeen{live: true, frozen: true}, guestPlan{thaw: true, mustThaw: true}},
		{"paused, save active", guestSeen{live: true, paused: true, save: qmp.MigrationActive, run: qmp.RunPaused},
			guestPlan{cancelSave: true, resume: true, thaw: true}},
		{"paused, save setting up", guestSeen{live: true, paused: true, save: qmp.MigrationSetup, run: qmp.RunPaused},
			guestPlan{cancelSave: true, resume: true, thaw: true}},
		{"paused, save completed", guestSeen{live: true, paused: true, save: qmp.MigrationCompleted, run: qmp.RunPostMigrate},
			guestPlan{resume: true, thaw: true}},
		{"paused, save failed", guestSeen{live: true, paused: true, save: qmp.MigrationFailed, run: qmp.RunPaused},
			guestPlan{resume: true, thaw: true}},
		{"paused, save cancelled", guestSeen{live: true, paused: true, save: qmp.MigrationCancelled, run: qmp.RunPaused},
			guestPlan{resume: true, thaw: true}},
		{"paused, no save yet", guestSeen{live: true, paused: true, save: qmp.MigrationNone, run: qmp.RunPaused},
			guestPlan{resume: true, thaw: true}},
		{"paused, finishing the save", guestSeen{live: true, paused: true, save: qmp.MigrationActive, run: qmp.RunFinishMigrate},
			guestPlan{cancelSave: true, resume: true, thaw: true}},
		{"paused, resumed before the kill", guestSeen{live: true, paused: true, save: qmp.MigrationCompleted, run: qmp.RunRunning},
			guestPlan{thaw: true}},
		{"paused, no migration answer", guestSeen{live: true, paused: true, run: qmp.RunPaused},
			guestPlan{resume: true, thaw: true}},
		{"paused, no status answer", guestSeen{live: true, paused: true, save: qmp.MigrationActive, runErr: errStatus},
			guestPlan{cancelSave: true, thaw: true}},
		{"paused before the stop was journaled, running", guestSeen{live: true, paused: true, save: qmp.MigrationNone, run: qmp.RunRunning},
			guestPlan{thaw: true}},
	} {
		if got := decideGuest(c.g); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestSeeGuest: only a guest the snapshot paused is asked about, its save
// and its run state.
func TestSeeGuest(t *testing.T) {
	q := &standIn{save: qmp.MigrationActive, run: qmp.RunPaused}
	g := seeGuest(context.Background(), q, snapIntent{Live: true}, true)
	if len(q.asked) != 0 || g != (guestSeen{live: true, frozen: true}) {
		t.Errorf("a guest not paused: asked %q, saw %+v", q.asked, g)
	}
	g = seeGuest(context.Background(), q, snapIntent{Live: true, Paused: true}, false)
	if want := []string{"query-migrate", "query-status"}; !slices.Equal(q.asked, want) {
		t.Errorf("asked %q, want %q", q.asked, want)
	}
	if decideGuest(g) != (guestPlan{cancelSave: true, resume: true, thaw: true}) {
		t.Errorf("saw %+v: %+v", g, decideGuest(g))
	}
}

// TestSeeSnapshot: QEMU's nodes say whether the disks run on the
// overlays (each overlay's node opened on its base); with QEMU gone, the
// files say whether the overlays were made; a recorded snapshot asks QEMU
// nothing.
func TestSeeSnapshot(t *testing.T) {
	dir := t.TempDir()
	layer := func(disk string) snapshottree.Layer {
		return snapshottree.Layer{Disk: disk, Overlay: snapshottree.Image{Path: filepath.Join(dir, disk+"-s1.qcow2")}}
	}
	in := snapIntent{Tag: "s1", Layers: []snapshottree.Layer{layer("root"), layer("data")}}
	node := func(l snapshottree.Layer, backing string) qmp.BlockNode {
		return qmp.BlockNode{NodeName: qemuargs.OverlayNodeName(l.Overlay.Path), BackingFile: backing}
	}
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		nodes []qmp.BlockNode
		on    bool
	}{
		{"both linked", []qmp.BlockNode{node(in.Layers[0], "/img/root.qcow2"), node(in.Layers[1], "/img/data.qcow2")}, true},
		{"one added, not linked", []qmp.BlockNode{node(in.Layers[0], "/img/root.qcow2"), node(in.Layers[1], "")}, false},
		{"one not added", []qmp.BlockNode{node(in.Layers[0], "/img/root.qcow2")}, false},
		{"none", nil, false},
	} {
		q := &standIn{nodes: c.nodes}
		s, err := seeSnapshot(ctx, q, qemuAnswers, in, journal(), false)
		if err != nil || s.onOverlays != c.on || decideSnapshot(s) != map[bool]snapFate{true: snapKeep, false: snapDrop}[c.on] {
			t.Errorf("%s: %+v %v", c.name, s, err)
		}
	}
	q := &standIn{err: errors.New("monitor closed")}
	if _, err := seeSnapshot(ctx, q, qemuAnswers, in, journal(), false); err == nil {
		t.Error("a failed query-named-block-nodes was not an error")
	}
	if s, err := seeSnapshot(ctx, q, qemuAnswers, in, journal(), true); err != nil || decideSnapshot(s) != snapRecorded {
		t.Errorf("recorded: %+v %v", s, err)
	}
	if s, _ := seeSnapshot(ctx, q, qemuGone, in, journal(), false); s.overlaysMade {
		t.Error("no overlay file, but made")
	}
	if err := os.WriteFile(in.Layers[0].Overlay.Path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, _ := seeSnapshot(ctx, q, qemuGone, in, journal(), false); s.overlaysMade {
		t.Error("one overlay file, but made")
	}
	if err := os.WriteFile(in.Layers[1].Overlay.Path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, _ := seeSnapshot(ctx, q, qemuGone, in, journal(), false); !s.overlaysMade || decideSnapshot(s) != snapRecordOff {
		t.Errorf("both overlay files: %+v", s)
	}
	if s, _ := seeSnapshot(ctx, q, qemuGone, snapIntent{RBD: []spec.Disk{{Name: "r"}}}, journal(stepSnapRBD), false); !s.overlaysMade || !s.rbdMade || s.files {
		t.Errorf("RBD only: %+v", s)
	}
	if !slices.Equal(q.asked, []string{"query-named-block-nodes"}) {
		t.Errorf("QEMU was asked %q", q.asked)
	}
}

// TestSnapshotNotes: what the CLI says after "recovered an interrupted
// snapshot: ".
func TestSnapshotNotes(t *testing.T) {
	got := map[snapFate]string{}
	for f := snapRecorded; f <= snapAskAgain; f++ {
		got[f] = f.note()
	}
	want := map[snapFate]string{
		snapRecorded:  "it was recorded",
		snapKeep:      "the disks ran on the new overlays: recorded the snapshot",
		snapDrop:      "the disks had not switched: removed the overlays",
		snapUnmade:    "the overlays were not all made: removed them",
		snapRBDUnmade: "the RBD snapshots were not all made: removed them",
		snapRecordOff: "recorded the snapshot (the VM is off)",
		snapAskAgain:  "", // the error says it
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
}

// TestRecoverSnapshotQEMUGone: a memory snapshot killed at each step, its
// VM's QEMU gone with it: the next command keeps the snapshot when its
// overlays were all made (with its memory state only once QEMU finished
// writing it), and takes it all back when they were not.
func TestRecoverSnapshotQEMUGone(t *testing.T) {
	for n := range len(snapMemorySteps) + 1 {
		for _, made := range []bool{false, true} {
			done := snapMemorySteps[:n]
			env := newEnv(t)
			dir := t.TempDir()
			in := snapIntent{Tag: "s1", Live: true, Paused: true, Layers: []snapshottree.Layer{{Disk: "root",
				Base: snapshottree.Image{Path: "/img/root.qcow2"}, Overlay: snapshottree.Image{Path: filepath.Join(dir, "root-s1.qcow2")}}},
				Snap: snapshottree.Snapshot{Tag: "s1", Memory: filepath.Join(dir, "s1.state")}}
			if err := os.WriteFile(in.Snap.Memory, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if made {
				if err := os.WriteFile(in.Layers[0].Overlay.Path, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			note := settle(t, env, opSnapshot, in, done...)
			tree, err := snapshottree.Load(env.Paths("web").Snapshots())
			if err != nil {
				t.Fatal(err)
			}
			sn := tree.Find("s1")
			whole := slices.Contains(done, stepSaved) || slices.Contains(done, stepSnapSwitch)
			_, merr := os.Stat(in.Snap.Memory)
			_, oerr := os.Stat(in.Layers[0].Overlay.Path)
			switch {
			case made && (sn == nil || note != "recovered an interrupted snapshot: recorded the snapshot (the VM is off)"):
				t.Errorf("killed after %v, overlays made: %q, %+v", done, note, sn)
			case made && (sn.Memory != "") != whole:
				t.Errorf("killed after %v: the snapshot's memory %q", done, sn.Memory)
			case !made && (sn != nil || note != "recovered an interrupted snapshot: the overlays were not all made: removed them"):
				t.Errorf("killed after %v, an overlay missing: %q, %+v", done, note, sn)
			case (merr == nil) != (whole && made) && made:
				t.Errorf("killed after %v: the memory state file: %v", done, merr)
			case (oerr == nil) != made:
				t.Errorf("killed after %v: the overlay: %v", done, oerr)
			}
		}
	}
}
