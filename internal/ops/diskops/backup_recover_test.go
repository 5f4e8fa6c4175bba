package diskops

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDecideBackup: a backup killed anywhere: the manifest says whether
// its point counts (kept) or not (its files go); a running QEMU has its
// jobs and nodes taken back either way; a monitor not to be had leaves the
// journal.
func TestDecideBackup(t *testing.T) {
	for _, c := range []struct {
		recorded bool
		qemu     qemuSeen
		want     backupAction
	}{
		{false, qemuAnswers, backupUndoLive},
		{false, qemuGone, backupUndoOff},
		{false, qemuUnknown, backupAskAgain},
		{true, qemuAnswers, backupKeepLive},
		{true, qemuGone, backupKeepOff},
		{true, qemuUnknown, backupAskAgain},
	} {
		if got := decideBackup(c.recorded, c.qemu); got != c.want {
			t.Errorf("recorded %v, QEMU %d: %d, want %d", c.recorded, c.qemu, got, c.want)
		}
	}
}

// TestBackupNotes: what the CLI says after "recovered an interrupted
// backup: ".
func TestBackupNotes(t *testing.T) {
	in := backupIntent{Dir: "/backups/web", Point: 3}
	got := map[backupAction]string{}
	for _, a := range []backupAction{backupKeepLive, backupKeepOff, backupUndoLive, backupUndoOff} {
		got[a] = a.note(in)
	}
	want := map[backupAction]string{
		backupKeepLive: "point 3 of /backups/web was recorded; cancelled its jobs and removed its nodes in QEMU",
		backupKeepOff:  "point 3 of /backups/web was recorded",
		backupUndoLive: "point 3 of /backups/web was not recorded: removed its files; cancelled its jobs and removed its nodes in QEMU",
		backupUndoOff:  "point 3 of /backups/web was not recorded: removed its files",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
}
