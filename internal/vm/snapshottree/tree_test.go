package snapshottree

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func none(string) bool { return false }

var disks = []Disk{{Name: "root", Own: Image{Path: "/img/root.raw", Format: "raw"}, OverlayDir: "/img"}}

func take(t *testing.T, tr *Tree, tag string) []Layer {
	t.Helper()
	l, err := tr.PlanTake(tag, disks, none)
	if err != nil {
		t.Fatal(err)
	}
	tr.Taken(Snapshot{Tag: tag}, l)
	return l
}

// TestTakeRevertRemove walks a tree through takes, a revert that drops the
// writes since, a refused removal of a branch point and merges.
func TestTakeRevertRemove(t *testing.T) {
	tr := &Tree{}
	a := take(t, tr, "a")
	if a[0].Base.Path != "/img/root.raw" || a[0].Overlay.Path != "/img/root@a.qcow2" || a[0].Overlay.Backing != "/img/root.raw" {
		t.Fatalf("take a: %+v", a)
	}
	b := take(t, tr, "b")
	if b[0].Base.Path != "/img/root@a.qcow2" || tr.Snapshots[1].Parent != "a" {
		t.Fatalf("take b: %+v %+v", b, tr.Snapshots)
	}
	if _, err := tr.PlanTake("b", disks, none); err == nil {
		t.Fatal("a second snapshot b was planned")
	}
	// Revert to a: a new overlay on root.raw; root@b (writes since b) goes.
	exists := func(p string) bool { return p == "/img/root@a.qcow2" }
	_, rl, err := tr.PlanRevert("a", disks, exists)
	if err != nil {
		t.Fatal(err)
	}
	if rl[0].Overlay.Path != "/img/root@a.1.qcow2" || rl[0].Base.Path != "/img/root.raw" {
		t.Fatalf("revert: %+v", rl)
	}
	if drop := tr.Reverted("a", rl); !reflect.DeepEqual(drop, []string{"/img/root@b.qcow2"}) {
		t.Fatalf("revert dropped %v", drop)
	}
	// root.raw now carries two branches: root@a (b's image) and root@a.1.
	if _, _, err := tr.PlanRemove("a"); err == nil || !strings.Contains(err.Error(), "2 branches") {
		t.Fatalf("remove a at a branch point: %v", err)
	}
	// b's image has nothing on it: removing b just drops it.
	_, m, err := tr.PlanRemove("b")
	if err != nil || m[0].From != nil || m[0].Drop != "/img/root@a.qcow2" {
		t.Fatalf("remove b: %+v %v", m, err)
	}
	tr.Removed("b", m)
	// Now a has one image on it (the active one): merged into root.raw,
	// and the disk runs on its own file again.
	_, m, err = tr.PlanRemove("a")
	if err != nil || m[0].From == nil || m[0].From.Path != "/img/root@a.1.qcow2" || m[0].Drop != "/img/root@a.1.qcow2" {
		t.Fatalf("remove a: %+v %v", m, err)
	}
	tr.Removed("a", m)
	if !tr.Empty() {
		t.Fatalf("tree not empty: %+v", tr)
	}
}

// TestRemoveMiddle: removing the older of two snapshots merges the newer
// one's image into the disk's file and re-bases what stands on it.
func TestRemoveMiddle(t *testing.T) {
	tr := &Tree{}
	take(t, tr, "a")
	take(t, tr, "b")
	_, m, err := tr.PlanRemove("a")
	if err != nil {
		t.Fatal(err)
	}
	if m[0].From.Path != "/img/root@a.qcow2" || !reflect.DeepEqual(m[0].Rebase, []string{"/img/root@b.qcow2"}) {
		t.Fatalf("plan: %+v", m)
	}
	tr.Removed("a", m)
	b := tr.Find("b")
	if b.Parent != "" || b.Disks["root"].Path != "/img/root.raw" || tr.Active["root"].Backing != "/img/root.raw" {
		t.Fatalf("after: %+v active %+v", b, tr.Active)
	}
	if got := tr.Files(); !reflect.DeepEqual(got, []string{"/img/root@b.qcow2"}) {
		t.Fatalf("files %v", got)
	}
}

func TestSaveLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s", "snapshots.json")
	tr := &Tree{}
	take(t, tr, "x")
	if err := tr.Save(p); err != nil {
		t.Fatal(err)
	}
	got, err := Load(p)
	if err != nil || got.Current != "x" || got.Active["root"].Path != "/img/root@x.qcow2" {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{"", ".x", "a/b", "a b", strings.Repeat("x", 49)} {
		if ValidTag(bad) == nil {
			t.Errorf("tag %q accepted", bad)
		}
	}
}
