package diskops

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/qmp"
)

// TestDecideMerge: one disk's merge, where a removal killed at each of its
// points leaves it. In a running QEMU: before the commit, the commit runs;
// a commit job left behind is finished (an active one pivoted once ready,
// one concluded only awaited); once the job is gone, From is closed if
// vmsup's node on it is still open, else nothing is left to do. With QEMU
// gone: From's file, the journal's pivot step and QEMU's event log say
// whether qemu-img must commit (never after QEMU pivoted: From is stale).
func TestDecideMerge(t *testing.T) {
	commit := func(st qmp.JobStatus) mergeSeen {
		return mergeSeen{live: true, hasJob: true, job: qmp.Job{ID: "vmsup-commit-root", Type: "commit", Status: st}, node: "ovl-1", inChain: true}
	}
	for _, c := range []struct {
		name string
		m    mergeSeen
		want mergeAction
	}{
		{"before the commit", mergeSeen{live: true, node: "ovl-1", inChain: true}, mergeCommitLive},
		{"job created", commit(qmp.JobCreated), mergeFinishPivot},
		{"job copying", commit(qmp.JobRunning), mergeFinishPivot},
		{"job paused", commit(qmp.JobPaused), mergeFinishPivot},
		{"job ready (pivot journaled or not)", commit(qmp.JobReady), mergeFinishPivot},
		{"job standby", commit(qmp.JobStandby), mergeFinishPivot},
		{"job waiting after job-complete", commit(qmp.JobWaiting), mergeFinishPivot},
		{"job pending", commit(qmp.JobPending), mergeFinishPivot},
		{"job aborting", commit(qmp.JobAborting), mergeFinishPivot},
		{"job concluded, not dismissed", commit(qmp.JobConcluded), mergeFinishJob},
		{"job of another type", mergeSeen{live: true, hasJob: true, job: qmp.Job{Type: "mirror", Status: qmp.JobRunning}}, mergeFinishJob},
		{"job dismissed, vmsup's node on From open", mergeSeen{live: true, node: "ovl-1"}, mergeCloseStale},
		{"From closed", mergeSeen{live: true}, mergeWasDone},
		{"QEMU gone, From deleted", mergeSeen{}, mergeWasDone},
		{"QEMU gone, From deleted, pivot journaled", mergeSeen{pivot: true}, mergeWasDone},
		{"QEMU gone before the pivot", mergeSeen{fromExists: true}, mergeCommitOffline},
		{"QEMU gone after the pivot, completed", mergeSeen{fromExists: true, pivot: true, completed: true}, mergeWasPivoted},
		{"QEMU gone in the pivot, not completed", mergeSeen{fromExists: true, pivot: true}, mergeCommitOffline},
		{"QEMU gone, a completion without the pivot journaled", mergeSeen{fromExists: true, completed: true}, mergeCommitOffline},
	} {
		if got := decideMerge(c.m); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestSeeMergeLive: the job is found by its id, From by its file; whether
// its node is in a chain is asked only of a node QEMU has.
func TestSeeMergeLive(t *testing.T) {
	m := snapshottree.Merge{Disk: "root", From: &snapshottree.Image{Path: "/img/root-s1.qcow2"}, Into: snapshottree.Image{Path: "/img/root.qcow2"}}
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		q     standIn
		want  mergeAction
		asked []string
	}{
		{"commit to run", standIn{jobs: []qmp.Job{{ID: "vmsup-commit-data", Type: "commit", Status: qmp.JobRunning}},
			open: map[string]string{m.From.Path: "ovl-1"}, chain: map[string]bool{"ovl-1": true}},
			mergeCommitLive, []string{"query-jobs", "node-on /img/root-s1.qcow2", "root-of ovl-1"}},
		{"job left", standIn{jobs: []qmp.Job{{ID: "vmsup-commit-root", Type: "commit", Status: qmp.JobReady}},
			open: map[string]string{m.From.Path: "ovl-1"}, chain: map[string]bool{"ovl-1": true}},
			mergeFinishPivot, []string{"query-jobs", "node-on /img/root-s1.qcow2", "root-of ovl-1"}},
		{"stale node", standIn{open: map[string]string{m.From.Path: "ovl-1"}},
			mergeCloseStale, []string{"query-jobs", "node-on /img/root-s1.qcow2", "root-of ovl-1"}},
		{"merged", standIn{}, mergeWasDone, []string{"query-jobs", "node-on /img/root-s1.qcow2"}},
	} {
		s, err := seeMergeLive(ctx, &c.q, m)
		if err != nil || decideMerge(s) != c.want || !slices.Equal(c.q.asked, c.asked) {
			t.Errorf("%s: %+v (%v), asked %q", c.name, s, err, c.q.asked)
		}
	}
	if _, err := seeMergeLive(ctx, &standIn{err: errors.New("monitor closed")}, m); err == nil {
		t.Error("a failed query-jobs was not an error")
	}
}

// TestMergeOffline: with QEMU gone, From is committed by qemu-img unless
// it is gone or QEMU pivoted the disk before it ended (the pivot
// journaled, and BLOCK_JOB_COMPLETED in its event history since the
// removal began): From is stale then, and a commit would write it over
// what the guest wrote to Into.
func TestMergeOffline(t *testing.T) {
	for _, c := range []struct {
		name      string
		from      bool // From's file exists
		pivot     bool
		completed string // the event's job ("" for none)
		commit    bool
	}{
		{"before the pivot", true, false, "", true},
		{"pivot journaled, no completion", true, true, "", true},
		{"pivot journaled, completed", true, true, "vmsup-commit-root", false},
		{"pivot journaled, another job completed", true, true, "vmsup-commit-data", true},
		{"completed, pivot not journaled", true, false, "vmsup-commit-root", true},
		{"From gone", false, true, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, calls := newEnv(t), toolStandIn(t)
			from := filepath.Join(t.TempDir(), "root-s1.qcow2")
			if c.from {
				if err := os.WriteFile(from, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s := New(env)
			s.Register()
			op, err := env.Ops().Begin(context.Background(), "web", opSnapshotRemove, snapRmIntent{Tag: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			defer op.End()
			if c.pivot {
				op.Step(stepPivot("root"))
			}
			if c.completed != "" {
				ev := eventlog.Record{Time: time.Now().UTC().Add(time.Second), VM: "web", Source: eventlog.SourceQEMU,
					Event: "BLOCK_JOB_COMPLETED", Data: json.RawMessage(`{"device":"` + c.completed + `","type":"commit"}`)}
				if err := eventlog.Append(env.Paths("web").EventHistory(), ev); err != nil {
					t.Fatal(err)
				}
			}
			m := snapshottree.Merge{Disk: "root", From: &snapshottree.Image{Path: from}}
			if err := s.mergeOffline(context.Background(), "web", op, m); err != nil {
				t.Fatal(err)
			}
			want := []string(nil)
			if c.commit {
				want = []string{"commit " + from}
			}
			if got := calls(); !slices.Equal(got, want) {
				t.Errorf("qemu-img was called %q, want %q", got, want)
			}
		})
	}
}

// TestRecoverSnapshotRemoveQEMUGone: a removal killed before a disk was
// merged has it merged by qemu-img; one killed after ("merged" journaled)
// only has the tree and the merged files finished.
func TestRecoverSnapshotRemoveQEMUGone(t *testing.T) {
	for _, merged := range []bool{false, true} {
		env, calls := newEnv(t), toolStandIn(t)
		dir := t.TempDir()
		over := snapshottree.Image{Path: filepath.Join(dir, "root-s1.qcow2"), Format: "qcow2"}
		if err := os.WriteFile(over.Path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		tree := &snapshottree.Tree{}
		tree.Taken(snapshottree.Snapshot{Tag: "s1"}, []snapshottree.Layer{{Disk: "root", Base: snapshottree.Image{Path: "/img/root.qcow2"}, Overlay: over}})
		if err := tree.Save(env.Paths("web").Snapshots()); err != nil {
			t.Fatal(err)
		}
		in := snapRmIntent{Tag: "s1", Merges: []snapshottree.Merge{{Disk: "root", Into: snapshottree.Image{Path: "/img/root.qcow2"}, From: &over, Drop: over.Path}}}
		var done []operation.Step
		if merged {
			done = append(done, stepMerged("root"))
		}
		note := settle(t, env, opSnapshotRemove, in, done...)
		tree, err := snapshottree.Load(env.Paths("web").Snapshots())
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"commit " + over.Path}
		if merged {
			want = nil
		}
		if note != `recovered an interrupted snapshot-rm: removed snapshot "s1"` || tree.Find("s1") != nil || exists(over.Path) {
			t.Errorf("merged %v: %q, tree %+v, From left %v", merged, note, tree, exists(over.Path))
		}
		if got := calls(); !slices.Equal(got, want) {
			t.Errorf("merged %v: qemu-img %q, want %q", merged, got, want)
		}
	}
}
