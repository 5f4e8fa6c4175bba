package diskops

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// moveSteps are a move's steps in the journal, in order (job-complete is
// journaled inside the pivot step, before the job is told).
var moveSteps = []operation.Step{"create", "confine", "nodes", "mirror", "ready", stepMoveJobComplete, "pivot", "record", "source"}

// TestDecideMove: a move killed anywhere, against QEMU's job and device.
// A job still copying or waiting at ready is cancelled (the device stays
// on the source), one in its pivot is awaited; then the device says which
// image won. With QEMU gone, the journal does: from job-complete on the
// target has the newest data.
func TestDecideMove(t *testing.T) {
	in := &moveIntent{Disk: "data", Job: "vmsup-move-data", Nodes: []string{"mvf-data", "mv-data"}}
	for _, c := range []struct {
		name string
		job  qmp.JobStatus // "": none
		// where the device is once the job is settled: on the target
		// when the settle pivots (an awaited pivot) or it had pivoted.
		pivoted bool
		want    moveAction
		looks   string // q: query-jobs, c: cancelled, a: awaited, d: the device looked at
	}{
		{"before the mirror", "", false, moveUndo, "qd"},
		{"job created", qmp.JobCreated, false, moveUndo, "qcd"},
		{"job copying", qmp.JobRunning, false, moveUndo, "qcd"},
		{"job paused", qmp.JobPaused, false, moveUndo, "qcd"},
		{"job ready, never told", qmp.JobReady, false, moveUndo, "qcd"},
		{"job standby", qmp.JobStandby, false, moveUndo, "qcd"},
		{"job waiting in its pivot", qmp.JobWaiting, true, moveRecord, "qad"},
		{"job pending in its pivot", qmp.JobPending, true, moveRecord, "qad"},
		{"job concluded after the pivot", qmp.JobConcluded, true, moveRecord, "qad"},
		{"job aborting", qmp.JobAborting, false, moveUndo, "qad"},
		{"job concluded without a pivot (cancelled outside)", qmp.JobConcluded, false, moveUndo, "qad"},
		{"job gone, pivoted", "", true, moveRecord, "qd"},
	} {
		q := &standIn{device: map[string]string{"data": "fmt-data"}}
		if c.job != "" {
			q.jobs = []qmp.Job{{ID: "vmsup-other", Status: qmp.JobRunning}, {ID: in.Job, Type: "mirror", Status: c.job}}
		} else if c.pivoted {
			q.device["data"] = "mv-data"
		}
		settle := func(_ context.Context, a moveAction) error {
			q.asked = append(q.asked, map[moveAction]string{moveCancelJob: "cancel", moveAwaitJob: "await"}[a])
			if c.pivoted {
				q.device["data"] = "mv-data"
			}
			return nil
		}
		for n := range len(moveSteps) + 1 { // QEMU is the truth, whatever the journal
			q.asked = nil
			if c.job == "" && !c.pivoted {
				q.device["data"] = "fmt-data"
			}
			a, err := seeMove(context.Background(), q, in, settle, moveSeen{qemu: true, jobComplete: n > 5})
			if err != nil || a != c.want || firstLetters(q.asked) != c.looks {
				t.Errorf("%s, killed after %v: %d (%v), asked %q, want %d, %q", c.name, moveSteps[:n], a, err, q.asked, c.want, c.looks)
			}
		}
	}
	for n := range len(moveSteps) + 1 {
		want := moveUndoOff
		if n > 5 {
			want = moveRecordOff
		}
		if got := decideMove(moveSeen{jobComplete: journal(moveSteps[:n]...)(stepMoveJobComplete)}); got != want {
			t.Errorf("QEMU gone, killed after %v: %d, want %d", moveSteps[:n], got, want)
		}
	}
	// A QEMU that does not answer: the journal stays.
	q := &standIn{err: errors.New("monitor closed")}
	if _, err := seeMove(context.Background(), q, in, nil, moveSeen{qemu: true}); err == nil {
		t.Error("a failed query-jobs was settled")
	}
}

// firstLetters is the first letter of each thing asked.
func firstLetters(asked []string) string {
	var b strings.Builder
	for _, a := range asked {
		b.WriteByte(a[0])
	}
	return b.String()
}

// TestMoveNotes: what the CLI says after "recovered an interrupted
// disk-move: ".
func TestMoveNotes(t *testing.T) {
	in := &moveIntent{Disk: "data", Source: spec.Disk{Type: spec.DiskFile, File: "/img/a.qcow2"}, Target: spec.Disk{Type: spec.DiskFile, File: "/img/b.qcow2"}}
	for _, c := range []struct {
		a          moveAction
		more, want string
	}{
		{moveRecord, "", `disk "data" had switched to /img/b.qcow2: recorded, the old image closed`},
		{moveRecord, "blockdev-del fmt-data: in use", `disk "data" had switched to /img/b.qcow2: recorded, the old image closed (not all of it: blockdev-del fmt-data: in use)`},
		{moveUndo, "", `disk "data" had not switched: the copy to /img/b.qcow2 was cancelled and the target removed; it stays on /img/a.qcow2`},
		{moveRecordOff, "the VM's file still names /img/a.qcow2", `QEMU ended during the pivot of disk "data": recorded /img/b.qcow2, which holds its newest data. the VM's file still names /img/a.qcow2`},
		{moveUndoOff, "", `QEMU ended before the pivot of disk "data": removed the target; it stays on /img/a.qcow2`},
	} {
		if got := c.a.note(in, c.more); got != c.want {
			t.Errorf("%d: %q, want %q", c.a, got, c.want)
		}
	}
}
