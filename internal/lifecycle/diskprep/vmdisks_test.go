package diskprep

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// TestCarried: the disks attached by hand during an earlier run come
// along, unless the file now has a disk of the same name.
func TestCarried(t *testing.T) {
	m := Manager{Store: vmstore.Store{Root: t.TempDir()}}
	f := &spec.File{Path: "/vm.toml", VM: spec.VM{Name: "vm", Disks: []spec.Disk{{Name: "root"}}}}
	if got, err := m.Carried(f); got != nil || err != nil {
		t.Fatalf("never started: %v, %v", got, err)
	}
	hot := spec.Disk{Name: "hot", Type: spec.DiskFile, File: "/img/hot.raw"}
	if err := m.Store.WriteApplied(&vmstore.Applied{Name: "vm", Attached: []vmstore.AttachedDisk{{Disk: hot}}}, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Carried(f); err != nil || len(got) != 1 || got[0].Name != "hot" {
		t.Fatalf("carried %v, %v", got, err)
	}
	f.VM.Disks = append(f.VM.Disks, spec.Disk{Name: "hot"})
	if _, err := m.Carried(f); err == nil || !strings.Contains(err.Error(), "vmsup disk detach vm hot") {
		t.Errorf("a file disk of the carried one's name: %v", err)
	}
}

// TestMovedFor: a move applies while the file names the disk's source as
// it was before the move; an edited file wins.
func TestMovedFor(t *testing.T) {
	d := spec.Disk{Name: "data", Type: spec.DiskFile, File: "/img/data.raw"}
	f := &spec.File{VM: spec.VM{Disks: []spec.Disk{d}}}
	mv := vmstore.MovedDisk{From: vmstore.DiskSource(d), Disk: spec.Disk{Name: "data", File: "/new/data.raw"}}
	if got := MovedFor(f, map[string]vmstore.MovedDisk{"data": mv, "gone": mv}); len(got) != 1 || got["data"].Disk.File != "/new/data.raw" {
		t.Errorf("moves %v", got)
	}
	f.VM.Disks[0].File = "/edited.raw"
	if got := MovedFor(f, map[string]vmstore.MovedDisk{"data": mv}); got != nil {
		t.Errorf("edited file: moves %v, want none", got)
	}
}

// TestBlockDevices: the unit may open the block devices of the disks the
// VM boots with (through symlinks, read-only ones read-only); a local
// migration's new QEMU those of its file.
func TestBlockDevices(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "by-id")
	if err := os.Symlink("/dev/null", link); err != nil {
		t.Fatal(err)
	}
	f := &spec.File{VM: spec.VM{Name: "vm", Disks: []spec.Disk{
		{Name: "a", Type: spec.DiskBlock, File: link},
		{Name: "b", Type: spec.DiskFile, File: "/img/b.raw"},
	}}}
	carried := spec.Disk{Name: "c", Type: spec.DiskBlock, File: "/dev/zero", ReadOnly: true}
	plan := &startplan.Plan{Paths: vmstore.Store{Root: dir}.Paths("vm")}
	if got := steps.Names(Manager{}.Steps(f, plan)); !slices.Equal(got, []string{Step}) {
		t.Fatalf("steps %q", got)
	}
	plan.Boot.Carried = []spec.Disk{carried} // the state-dir step's, after the steps are listed
	var u units.Unit
	plan.ApplyUnit(&u)
	want := []units.DeviceRule{{Path: "/dev/null", Access: "rw"}, {Path: "/dev/zero", Access: "r"}}
	if !slices.Equal(u.DeviceAllow, want) {
		t.Errorf("start: DeviceAllow %v, want %v", u.DeviceAllow, want)
	}
	plan = &startplan.Plan{Boot: startplan.Boot{Carried: []spec.Disk{carried}}}
	if err := (Manager{}).Reuse(f, plan); err != nil {
		t.Fatal(err)
	}
	u = units.Unit{}
	plan.ApplyUnit(&u)
	if !slices.Equal(u.DeviceAllow, want[:1]) {
		t.Errorf("reuse: DeviceAllow %v, want %v", u.DeviceAllow, want[:1])
	}
}

// TestRecord: the carried disks become the record's attached ones; the
// spare root ports are the boot file's.
func TestRecord(t *testing.T) {
	a := &vmstore.Applied{Attached: []vmstore.AttachedDisk{{Disk: spec.Disk{Name: "old"}}}}
	Record(a, &spec.VM{}, []spec.Disk{{Name: "hot"}})
	if len(a.Attached) != 1 || a.Attached[0].Disk.Name != "hot" {
		t.Errorf("attached %+v", a.Attached)
	}
}

// TestSamePath: one file through a symlink; two files are two.
func TestSamePath(t *testing.T) {
	dir := t.TempDir()
	a, b, l := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "l")
	os.WriteFile(a, nil, 0o600)
	os.WriteFile(b, nil, 0o600)
	os.Symlink(a, l)
	if !SamePath(a, l) || SamePath(a, b) || SamePath(a, filepath.Join(dir, "missing")) || !SamePath("/x/missing", "/x/missing") {
		t.Error("SamePath")
	}
}
