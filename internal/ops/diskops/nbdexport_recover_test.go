package diskops

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDecideExportEnd: an export taken down as asked (committed) lets its
// bitmap go and the next count from its moment; one whose vmsup died (or
// that failed) may not have been read: the exported bitmap records again
// (with what the next one saw), or for a full export the next one goes.
func TestDecideExportEnd(t *testing.T) {
	for _, c := range []struct {
		committed bool
		old       string
		want      bitmapAction
	}{
		{true, "", bitmapKeep},
		{true, "vmsup-nbd-2", bitmapDropOld},
		{false, "vmsup-nbd-2", bitmapRollBack},
		{false, "", bitmapDropNew},
	} {
		if got := decideBitmaps(c.committed, c.old); got != c.want {
			t.Errorf("committed %v, old %q: %d, want %d", c.committed, c.old, got, c.want)
		}
	}
	for q, want := range map[qemuSeen]exportAction{qemuAnswers: exportTakeDown, qemuGone: exportGone, qemuUnknown: exportAskAgain} {
		if got := decideTakeDown(q); got != want {
			t.Errorf("QEMU %d: %d, want %d", q, got, want)
		}
	}
	if nbdRecovered != "the NBD export was taken down; its bitmap counts on from the export before" {
		t.Errorf("note: %q", nbdRecovered)
	}
}

// TestRecoverNBDExportQEMUGone: an export whose vmsup and QEMU died has
// its socket and fleece overlays removed.
func TestRecoverNBDExportQEMUGone(t *testing.T) {
	env := newEnv(t)
	dir := t.TempDir()
	in := nbdIntent{Socket: filepath.Join(dir, "nbd.sock"), Disks: []nbdDisk{{Disk: "root", Fleece: filepath.Join(dir, "nbd-root.qcow2")}}}
	for _, f := range []string{in.Socket, in.Disks[0].Fleece} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if note := settle(t, env, opNBDExport, in); note != "recovered an interrupted nbd-export: "+nbdRecovered || exists(in.Socket) || exists(in.Disks[0].Fleece) {
		t.Errorf("%q; socket left %v, fleece left %v", note, exists(in.Socket), exists(in.Disks[0].Fleece))
	}
}
