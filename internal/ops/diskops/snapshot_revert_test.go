package diskops

import (
	"context"
	"slices"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// revertSteps are a revert's steps in the journal, in order, to the start
// (whose own steps follow, journaled in the same operation).
var revertSteps = []operation.Step{stepRevertOverlays, stepRevertStopping, stepRevertStopped, stepRevertRecord, "unit"}

// TestDecideRevert: a revert killed at each of its points. With the VM's
// unit down, the revert is finished (and the VM started, if meant to).
// With it up: never stopped, nothing changed; stopped but not recorded as
// reverted, something else started it; reverted, the revert's own start
// runs it, and a start from memory is resumed (it read the state) or
// started again (it never did).
func TestDecideRevert(t *testing.T) {
	var rows []struct {
		name string
		s    revertSeen
		want revertAction
	}
	add := func(name string, s revertSeen, want revertAction) {
		rows = append(rows, struct {
			name string
			s    revertSeen
			want revertAction
		}{name, s, want})
	}
	for n := range len(revertSteps) + 1 {
		has := journal(revertSteps[:n]...)
		for _, memory := range []bool{false, true} {
			for _, reverted := range []bool{false, true} {
				add("unit down", revertSeen{stopped: has(stepRevertStopped), memory: memory, reverted: reverted}, revertFinish)
			}
		}
		if !has(stepRevertStopped) {
			for _, memory := range []bool{false, true} {
				add("unit up, not stopped", revertSeen{unitUp: true, memory: memory, run: qmp.RunRunning}, revertUntouched)
			}
			continue
		}
		add("unit up, not reverted", revertSeen{unitUp: true, stopped: true}, revertRaced)
		add("unit up, not reverted, memory", revertSeen{unitUp: true, stopped: true, memory: true, run: qmp.RunPaused}, revertRaced)
		add("unit up, reverted", revertSeen{unitUp: true, stopped: true, reverted: true, run: qmp.RunPaused}, revertFinishUp)
		add("unit up, reverted, at -S", revertSeen{unitUp: true, stopped: true, reverted: true, run: qmp.RunPrelaunch}, revertRestart)
		for run, want := range map[qmp.RunState]revertAction{
			qmp.RunRunning:       revertFinishUp,
			qmp.RunPaused:        revertResume,
			qmp.RunPostMigrate:   revertResume,
			qmp.RunPrelaunch:     revertRestart, // its disks may not be plugged yet
			qmp.RunInMigrate:     revertRestart,
			"":                   revertRestart, // no answer
			qmp.RunShutdown:      revertRestart,
			qmp.RunInternalError: revertRestart,
		} {
			add("unit up, reverted, memory, "+string(run), revertSeen{unitUp: true, stopped: true, reverted: true, memory: true, run: run}, want)
		}
	}
	for _, r := range rows {
		if got := decideRevert(r.s); got != r.want {
			t.Errorf("%s (%+v): %d, want %d", r.name, r.s, got, r.want)
		}
	}
	t.Logf("%d cases", len(rows))
}

// TestSeeRevert: systemd says whether the VM runs; only then are the tree
// and (for a start from memory) the QEMU's run state looked at.
func TestSeeRevert(t *testing.T) {
	env := newEnv(t)
	s := New(env)
	in := revertIntent{Tag: "s1", Layers: []snapshottree.Layer{{Disk: "root", Overlay: snapshottree.Image{Path: "/img/root-r1.qcow2"}}}, Memory: "/state/s1"}
	tree := &snapshottree.Tree{Current: "s1", Active: map[string]snapshottree.Image{"root": {Path: "/img/root-r1.qcow2"}}}
	if err := tree.Save(env.Paths("web").Snapshots()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		unit  units.Status
		want  revertAction
		asked []string
	}{
		{"unit gone", unitGone, revertFinish, []string{"unit"}},
		{"unit not loaded", units.Status{}, revertFinish, []string{"unit"}},
		{"unit up", unitUp, revertResume, []string{"unit", "run-state"}},
	} {
		q := &standIn{unit: c.unit, run: qmp.RunPaused}
		seen, err := s.seeRevert(ctx, q, "web", in, journal(revertSteps[:3]...))
		if err != nil || decideRevert(seen) != c.want || !slices.Equal(q.asked, c.asked) {
			t.Errorf("%s: %+v %v, asked %q", c.name, seen, err, q.asked)
		}
	}
	in.Layers[0].Overlay.Path = "/img/root-r2.qcow2" // the tree has another revert
	// Its QEMU answers: one that does not is waited for (30 s x load).
	seen, _ := s.seeRevert(ctx, &standIn{unit: unitUp, run: qmp.RunPaused}, "web", in, journal(revertSteps[:3]...))
	if decideRevert(seen) != revertRaced {
		t.Errorf("another revert recorded: %+v", seen)
	}
}

// TestRevertNotes: what the CLI says after "recovered an interrupted
// snapshot-revert: ".
func TestRevertNotes(t *testing.T) {
	for a := revertFinish; a <= revertRestart; a++ {
		want := `reverted to "s1"`
		switch a {
		case revertUntouched:
			want = "the VM had not been stopped: nothing was changed"
		case revertRaced:
			want = `the VM was started again by something else before the revert to "s1" was recorded: the revert was dropped (revert again)`
		}
		if got := a.note("s1"); got != want {
			t.Errorf("%d: %q, want %q", a, got, want)
		}
	}
}
