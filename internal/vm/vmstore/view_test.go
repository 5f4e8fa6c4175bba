package vmstore

import (
	"slices"
	"testing"

	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/spec"
)

// TestView: the view joins the record's spec (with defaults), the live
// resizes, the moved disks (only while the file still names their old
// place), the attached disks and NICs, and the snapshot tree's overlays;
// Images lists what QEMU holds open, down the tree's chain.
func TestView(t *testing.T) {
	s := Store{Root: t.TempDir()}
	vm := &spec.VM{Name: "web", CPUs: 1, Memory: 256 * spec.MiB,
		Disks: []spec.Disk{
			{Name: "root", Type: spec.DiskFile, File: "/img/root.qcow2", Format: "qcow2"},
			{Name: "data", Type: spec.DiskFile, File: "/img/data.raw", Format: "raw"},
			{Name: "cd", Type: spec.DiskISO, File: "/img/cd.iso", Format: "raw"},
		},
		NICs: []spec.NIC{{Name: "net0", Type: spec.NICUser}}}
	app := &Applied{Name: "web", SourceFile: "/etc/vms/web.toml", Spec: Canonical(vm),
		Resized: &Resized{CPUs: 3, Memory: 512 * spec.MiB},
		Moved: map[string]MovedDisk{
			"data": {From: "/img/data.raw", Disk: spec.Disk{Name: "data", Type: spec.DiskFile, File: "/fast/data.qcow2", Format: "qcow2"}},
			"root": {From: "/img/elsewhere.qcow2", Disk: spec.Disk{Name: "root", File: "/stale.qcow2"}}, // the file names another place now
		},
		Attached:     []AttachedDisk{{Disk: spec.Disk{Name: "hot", Type: spec.DiskFile, File: "/img/hot.qcow2", Format: "qcow2"}, Bus: "rp2"}},
		AttachedNICs: []spec.NIC{{Name: "hot0", Type: spec.NICUser}},
	}
	if err := s.WriteApplied(app, []byte("name = \"web\"\n")); err != nil {
		t.Fatal(err)
	}
	tree := &snapshottree.Tree{
		Active: map[string]snapshottree.Image{"root": {Path: "/img/root-s2.qcow2", Format: "qcow2", Backing: "/img/root-s1.qcow2"}},
		Snapshots: []snapshottree.Snapshot{
			{Tag: "s1", Disks: map[string]snapshottree.Image{"root": {Path: "/img/root.qcow2", Format: "qcow2"}}},
			{Tag: "s2", Disks: map[string]snapshottree.Image{"root": {Path: "/img/root-s1.qcow2", Format: "qcow2", Backing: "/img/root.qcow2"}}},
		},
	}
	if err := tree.Save(s.Paths("web").Snapshots()); err != nil {
		t.Fatal(err)
	}
	v, err := s.View("web")
	if err != nil {
		t.Fatal(err)
	}
	if v.Owner != "/etc/vms/web.toml" || v.Running {
		t.Errorf("owner %q, running %v", v.Owner, v.Running)
	}
	if v.Booted.CPUs != 1 || v.Spec.CPUs != 3 || v.Spec.Memory != 512*spec.MiB || v.Booted.Machine == "" {
		t.Errorf("booted %d vCPUs (machine %q), running %d vCPUs %s", v.Booted.CPUs, v.Booted.Machine, v.Spec.CPUs, v.Spec.Memory)
	}
	var got []string
	for _, d := range v.Disks {
		got = append(got, d.Name+"="+d.File+"@"+d.Active.Path)
	}
	want := []string{"root=/img/root.qcow2@/img/root-s2.qcow2", "data=/fast/data.qcow2@/fast/data.qcow2", "cd=/img/cd.iso@", "hot=/img/hot.qcow2@/img/hot.qcow2"}
	if !slices.Equal(got, want) {
		t.Errorf("disks:\n got %q\nwant %q", got, want)
	}
	if d := v.Disk("data"); d == nil || d.MovedFrom != "/img/data.raw" {
		t.Errorf("data: %+v", d)
	}
	if d := v.Disk("hot"); d == nil || !d.Attached || d.Bus != "rp2" {
		t.Errorf("hot: %+v", d)
	}
	if n := v.NIC("hot0"); n == nil || !n.Attached || v.NIC("net0").Attached {
		t.Errorf("nics: %+v", v.NICs)
	}
	if w := v.Writable(); len(w) != 3 {
		t.Errorf("writable disks: %d, want 3 (not the CD-ROM)", len(w))
	}
	wantImages := []string{"/img/root-s2.qcow2", "/img/root-s1.qcow2", "/img/root.qcow2", "/fast/data.qcow2", "/img/hot.qcow2"}
	if got := v.Images(); !slices.Equal(got, wantImages) {
		t.Errorf("images:\n got %q\nwant %q", got, wantImages)
	}
	if o := v.Disk("root").Opened(); o.File != "/img/root-s2.qcow2" || o.Backing != "" || o.Size != 0 {
		t.Errorf("root opened as %+v", o)
	}
	if _, err := s.View("nosuch"); err != ErrNoRecord {
		t.Errorf("view of an unknown VM: %v", err)
	}
}
