package livemigrate

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// The recoverers' decisions, against stand-ins for systemd, the QEMUs'
// monitors, the destination's vmsup and the shared disks' locks: what
// they answer is set per case, and what was asked is logged.

// standIn answers the looks of a migration's recovery.
type standIn struct {
	units  map[string]units.Status // by unit; a missing one is not loaded
	endsAt int                     // the units end at this status call (0: never)
	run    qmp.RunState            // a QEMU's at its monitor ("": none answers)
	srcErr error                   // the source's monitor cannot be had
	dest   answer                  // the destination's vmsup
	locks  answer                  // the shared disks' locks
	asked  []string
}

func (q *standIn) Status(_ context.Context, unit string) (units.Status, error) {
	q.asked = append(q.asked, "unit "+unit)
	if q.endsAt > 0 && strings.Count(looked(q.asked), "u") >= q.endsAt {
		return gone, nil
	}
	return q.units[unit], nil
}

func (q *standIn) RunStateAt(context.Context, string) qmp.RunState {
	q.asked = append(q.asked, "run-state")
	return q.run
}

func (q *standIn) sourceState(context.Context, string) (qmp.RunState, error) {
	q.asked = append(q.asked, "source")
	return q.run, q.srcErr
}

func (q *standIn) askDestination(context.Context, string, migrateIntent) (bool, bool) {
	q.asked = append(q.asked, "destination")
	return q.dest == answerYes, q.dest == answerYes || q.dest == answerNo
}

func (q *standIn) lockedElsewhere(string, []string) (bool, bool) {
	q.asked = append(q.asked, "locks")
	return q.locks == answerYes, q.locks == answerYes || q.locks == answerNo
}

var (
	_ unitStates = (*standIn)(nil)
	_ qemuStates = (*standIn)(nil)
	_ elsewhere  = (*standIn)(nil)
)

var (
	up   = units.Status{Exists: true, ActiveState: "active", SubState: "running"}
	gone = units.Status{Exists: true, ActiveState: "failed", SubState: "failed"}
)

// looked is what a stand-in was asked, in short: s the source's run
// state, d the destination, l the locks.
func looked(asked []string) string {
	var b strings.Builder
	for _, a := range asked {
		b.WriteByte(a[0])
	}
	return b.String()
}

// TestDecideRemote: a migration to another host whose source side was
// killed after each of its steps, in each state the two hosts can be
// found in. Before finalize was sent the destination cannot run the
// guest: the source keeps it. Once the destination was told to run it
// (finalized), the source goes. In between only the destination can say,
// asked over the transport, or else the shared disks' write locks; when
// neither can, the source stays paused and the error says what to do.
// The source's QEMU is asked its state only while its unit is up.
func TestDecideRemote(t *testing.T) {
	type world struct {
		name        string
		srcGone     bool
		run         qmp.RunState
		dest, locks answer
	}
	worlds := []world{
		{"source runs the guest", false, qmp.RunRunning, answerNo, answerNo},
		{"source paused, destination has not the guest", false, qmp.RunPaused, answerNo, answerNo},
		{"source paused after the stream, destination runs the guest", false, qmp.RunPostMigrate, answerYes, answerYes},
		{"source paused, destination unreachable, its QEMU holds the locks", false, qmp.RunPostMigrate, answerUnknown, answerYes},
		{"source paused, destination unreachable, locks free", false, qmp.RunPaused, answerUnknown, answerNo},
		{"source paused, destination unreachable, no locks to read", false, qmp.RunPaused, answerUnknown, answerUnknown},
		{"source gone, destination runs the guest", true, "", answerYes, answerYes},
		{"source gone, destination has not the guest", true, "", answerNo, answerNo},
		{"source gone, destination unreachable", true, "", answerUnknown, answerUnknown},
	}
	type want struct {
		a     remoteAction
		looks string
	}
	var (
		runs   = want{remoteSourceRuns, "s"}
		resume = want{remoteResume, "s"}
		ended  = want{remoteSourceEnded, ""}
		quit   = want{remoteQuitSource, ""}
		drop   = want{remoteDropRecords, ""}
	)
	// By kill point (the steps journaled), one per world, in its order.
	wants := [][]want{
		{runs, resume, resume, resume, resume, resume, ended, ended, ended}, // before prepared
		{runs, resume, resume, resume, resume, resume, ended, ended, ended}, // prepared
		{runs, resume, resume, resume, resume, resume, ended, ended, ended}, // completed
		{runs, {remoteResume, "sd"}, {remoteQuitSource, "sd"}, {remoteQuitSource, "sdl"}, {remoteResume, "sdl"}, {remoteStuck, "sdl"},
			{remoteDropRecords, "d"}, {remoteSourceEnded, "d"}, {remoteSourceEnded, "d"}}, // finalize-sent
		{quit, quit, quit, quit, quit, quit, drop, drop, drop}, // finalized
		{quit, quit, quit, quit, quit, quit, drop, drop, drop}, // quit-sent
		{quit, quit, quit, quit, quit, quit, drop, drop, drop}, // source-quit
	}
	steps := MigrateSteps()
	n := 0
	for k, row := range wants {
		done := map[string]bool{}
		for _, s := range steps[:k] {
			done[s] = true
		}
		for i, w := range worlds {
			q := &standIn{run: w.run, dest: w.dest, locks: w.locks}
			s := remoteSeen{srcGone: w.srcGone, finalizeSent: done[string(stepMigFinalizeSent)],
				finalized: done[string(stepMigFinalized)], sourceQuit: done[string(stepMigSourceQuit)]}
			a, _, err := seeRemote(context.Background(), q, "web", migrateIntent{To: "b"}, s)
			if err != nil || a != row[i].a || looked(q.asked) != row[i].looks {
				t.Errorf("killed after %v, %s: %d %q (looked %q, %v), want %d %q (looked %q)",
					steps[:k], w.name, a, a.note("b"), q.asked, err, row[i].a, row[i].a.note("b"), row[i].looks)
			}
			n++
		}
	}
	t.Logf("%d cases", n)

	// A source whose monitor cannot be had: the journal stays.
	q := &standIn{srcErr: errors.New("monitor busy")}
	if _, _, err := seeRemote(context.Background(), q, "web", migrateIntent{}, remoteSeen{finalizeSent: true}); err == nil {
		t.Error("a source that does not answer was settled")
	}
}

// TestDecideLocal: a migration on one host, its CLI killed anywhere. The
// record says whether the hand-over was committed; else the new QEMU keeps
// the guest if it runs it (or has it paused with the source's gone), the
// source keeps it while its QEMU is up, and with both gone nothing does.
// The new QEMU is asked only while its unit is up and its incoming
// directory there.
func TestDecideLocal(t *testing.T) {
	const (
		usual = "vmsup-web.service"
		alt   = "vmsup-web@alt.service"
	)
	for _, c := range []struct {
		name          string
		record, dest  string // the unit the record names ("": the usual one), the new QEMU's
		src, destUnit units.Status
		inDir         bool
		run           qmp.RunState
		want          localAction
		looks         string
	}{
		{"recorded on the other unit", alt, alt, up, up, false, "", localRecorded, ""},
		{"recorded on the other unit, directory left", alt, alt, gone, up, true, "", localRecorded, ""},
		{"back to the usual unit, recorded", "", usual, gone, up, true, "", localRecorded, ""},
		{"back to the usual unit, new QEMU runs the guest", alt, usual, up, up, true, qmp.RunRunning, localHandOver, "uur"},
		{"back to the usual unit, new QEMU paused, source gone", alt, usual, gone, up, true, qmp.RunPaused, localAdoptPaused, "uur"},
		{"new QEMU runs the guest, source up", "", alt, up, up, true, qmp.RunRunning, localHandOver, "uur"},
		{"new QEMU runs the guest, source gone", "", alt, gone, up, true, qmp.RunRunning, localAdopt, "uur"},
		{"new QEMU paused, source gone", "", alt, gone, up, true, qmp.RunPaused, localAdoptPaused, "uur"},
		{"new QEMU paused, source up", "", alt, up, up, true, qmp.RunPaused, localKeepSource, "uur"},
		{"new QEMU waiting for the stream", "", alt, up, up, true, qmp.RunInMigrate, localKeepSource, "uur"},
		{"new QEMU received it, not resumed", "", alt, up, up, true, qmp.RunPostMigrate, localKeepSource, "uur"},
		{"new QEMU's unit gone", "", alt, up, gone, true, "", localKeepSource, "u"},
		{"no incoming directory yet", "", alt, up, up, false, "", localKeepSource, "u"},
		{"new QEMU waiting, source gone", "", alt, gone, up, true, qmp.RunInMigrate, localLost, "uur"},
		{"both gone", "", alt, gone, gone, true, "", localLost, "u"},
		{"new QEMU's unit ended while asked, source up", "", alt, up, up, true, "", localKeepSource, "uuru"},
	} {
		q := &standIn{units: map[string]units.Status{c.dest: c.destUnit}, run: c.run}
		if strings.HasSuffix(c.looks, "ru") {
			q.endsAt = 3 // no answer, then its unit ends
		}
		s := localSeen{recordUnit: c.record, destUnit: c.dest, usualUnit: usual, srcGone: c.src.Gone(), inDir: c.inDir}
		a, _, err := seeLocal(context.Background(), q, q, func() string { return "qmp.sock" }, s)
		if err != nil || a != c.want || looked(q.asked) != c.looks {
			t.Errorf("%s: %d %q (looked %q, %v), want %d (looked %q)", c.name, a, a.note(), q.asked, err, c.want, c.looks)
		}
	}
}

// TestUnansweredDestination: a new QEMU whose unit stays up and that does
// not answer is never guessed at: the recovery fails (its journal stays
// for the guardian to try again).
func TestUnansweredDestination(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // as the wait for an answer would end, sooner
	q := &standIn{units: map[string]units.Status{"u1": up}}
	if a, _, err := seeLocal(ctx, q, q, func() string { return "qmp.sock" }, localSeen{destUnit: "u1", inDir: true}); err == nil {
		t.Errorf("local: %d", a)
	}
	if a, _, err := seeIn(ctx, q, q, "u1", func() string { return "qmp.sock" }, inSeen{inDir: true, app: true}); err == nil {
		t.Errorf("in: %d", a)
	}
}

// TestDecideIn: the destination of a migration from another host, its
// receiver killed anywhere: recorded once its incoming directory is gone
// with its unit up; its QEMU adopted if it runs the guest and the record
// step gave the journal what to record; else torn down.
func TestDecideIn(t *testing.T) {
	for _, c := range []struct {
		name   string
		unit   units.Status
		endsAt int
		inDir  bool
		app    bool
		run    qmp.RunState
		want   inAction
		looks  string
	}{
		{"before its start", units.Status{}, 0, false, false, "", inTearDown, "u"},
		{"unit gone", gone, 0, true, true, "", inTearDown, "u"},
		{"waiting for the stream", up, 0, true, false, qmp.RunInMigrate, inTearDown, "uur"},
		{"stream received, not recorded", up, 0, true, false, qmp.RunPaused, inTearDown, "uur"},
		{"recorded, not resumed", up, 0, true, true, qmp.RunPaused, inTearDown, "uur"},
		{"resumed before the record step", up, 0, true, false, qmp.RunRunning, inTearDown, "uur"},
		{"resumed, recorded in the journal", up, 0, true, true, qmp.RunRunning, inAdopt, "uur"},
		{"unit ended while asked", up, 3, true, true, "", inTearDown, "uuru"},
		{"handed over and recorded", up, 0, false, true, qmp.RunRunning, inRecorded, "u"},
	} {
		q := &standIn{units: map[string]units.Status{"u1": c.unit}, endsAt: c.endsAt, run: c.run}
		a, _, err := seeIn(context.Background(), q, q, "u1", func() string { return "qmp.sock" }, inSeen{inDir: c.inDir, app: c.app})
		if err != nil || a != c.want || looked(q.asked) != c.looks {
			t.Errorf("%s: %d %q (looked %q, %v), want %d (looked %q)", c.name, a, a.note(), q.asked, err, c.want, c.looks)
		}
	}
}

// TestRecoverNotes: what the CLI says after "recovered an interrupted
// migrate" / "migrate-in".
func TestRecoverNotes(t *testing.T) {
	for a, want := range map[remoteAction]string{
		remoteDropRecords: "the guest runs on b: this host's records are removed",
		remoteSourceEnded: "the source's QEMU ended during the migration",
		remoteQuitSource:  "the guest runs on b: this host's copy is removed",
		remoteSourceRuns:  "the guest runs on the source; the destination tears its QEMU down when its transport closes",
		remoteResume:      "the destination does not run the guest: it runs on the source again",
	} {
		if got := a.note("b"); got != want {
			t.Errorf("remote %d: %q, want %q", a, got, want)
		}
	}
	if got := errStuck("b").Error(); got != "the destination b may run the guest and cannot be asked (its transport fails) nor told by the disks' locks: "+
		"the source stays paused; check b, then vmsup resume here or vmsup down here" {
		t.Errorf("stuck: %q", got)
	}
	for a, want := range map[localAction]string{
		localRecorded:    "the new QEMU had taken over and was recorded",
		localHandOver:    "the new QEMU runs the guest: the hand-over is finished",
		localAdopt:       "the new QEMU runs the guest: the hand-over is finished",
		localAdoptPaused: "the new QEMU runs the guest: the hand-over is finished",
		localKeepSource:  "the guest runs on in the source QEMU; the new QEMU was removed",
	} {
		if got := a.note(); got != want {
			t.Errorf("local %d: %q, want %q", a, got, want)
		}
	}
	if errLocalLost.Error() != "neither QEMU runs the guest any more (the source's is gone, the new one had not received it all)" {
		t.Errorf("lost: %q", errLocalLost)
	}
	for a, want := range map[inAction]string{
		inRecorded: "the guest runs here: the migration had been recorded",
		inAdopt:    "the guest runs here: the hand-over is finished and recorded",
		inTearDown: "the incoming QEMU had not taken over: it is torn down",
	} {
		if got := a.note(); got != want {
			t.Errorf("in %d: %q, want %q", a, got, want)
		}
	}
}
