package diskops

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/backupchain"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// newEnv is a real environment on a fresh state root with VM web's
// records directory and no QEMU: what a recoverer sees after the VM died
// with the command. The host facts are given, so nothing is probed.
func newEnv(t *testing.T) *machine.Env {
	t.Helper()
	env, err := machine.New(machine.Options{Root: t.TempDir(), Host: &machine.Host{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	if err := os.MkdirAll(env.Paths("web").Records, 0o700); err != nil {
		t.Fatal(err)
	}
	return env
}

// grantUses writes VM web's confinement record as a start leaves it,
// granting its QEMU paths (internal/lifecycle/confine's Root/security).
func grantUses(t *testing.T, env *machine.Env, paths ...string) {
	t.Helper()
	b, err := json.Marshal(confine.Record{Uses: paths})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(env.Root(), "security")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "web.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// settle journals an operation of kind with intent and steps done, as a
// command killed after them leaves it, and settles it the way the VM's
// next command does (the kernel, with the recoverers Register gave it).
func settle(t *testing.T, env *machine.Env, kind operation.Kind, intent any, done ...operation.Step) string {
	t.Helper()
	k := env.Ops()
	New(env).Register()
	ctx := context.Background()
	op, err := k.Begin(ctx, "web", kind, intent)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range done {
		op.Step(s)
	}
	op.Close() // its command dies here
	note, err := k.Settle(ctx, "web", "test")
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := k.Pending("web"); p != nil {
		t.Fatalf("%s: the journal stayed", kind)
	}
	return note
}

// TestRecoverBackupQEMUGone: a point not in the manifest loses its files;
// a recorded one keeps them.
func TestRecoverBackupQEMUGone(t *testing.T) {
	for _, recorded := range []bool{false, true} {
		env := newEnv(t)
		dir := t.TempDir()
		m := backupchain.New("web", "")
		in := backupIntent{Dir: dir, Point: m.Next(), Chain: m.Chain,
			Disks: []backupchain.DiskPlan{{Disk: "root", File: backupchain.FileName("root", m.Next())}}}
		file := filepath.Join(dir, in.Disks[0].File)
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if recorded {
			m.Points = append(m.Points, backupchain.Point{N: in.Point})
			if err := m.Save(dir); err != nil {
				t.Fatal(err)
			}
		}
		note := settle(t, env, opBackup, in)
		if _, err := os.Stat(file); (err == nil) != recorded {
			t.Errorf("recorded %v: the point's file: %v (%s)", recorded, err, note)
		}
	}
}

// TestRecoverDiskMoveQEMUGone: with QEMU gone, a move that reached
// job-complete is recorded on its target (the only image written since);
// one that had not is taken back (its grants and the file it made).
func TestRecoverDiskMoveQEMUGone(t *testing.T) {
	for _, pivoted := range []bool{false, true} {
		env := newEnv(t)
		src := spec.Disk{Name: "data", Type: spec.DiskFile, File: "/images/data.qcow2", Format: spec.FormatQcow2}
		tgt := src
		tgt.File = filepath.Join(t.TempDir(), "new.qcow2")
		if err := os.WriteFile(tgt.File, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := env.State().WriteApplied(&vmstore.Applied{Name: "web"}, []byte("name = \"web\"\n")); err != nil {
			t.Fatal(err)
		}
		grantUses(t, env, tgt.File)
		in := moveIntent{Disk: "data", Source: src, Target: tgt, FromFile: true, FileSource: src.File, Created: true,
			Rules: []string{tgt.File}}
		var done []operation.Step
		if pivoted {
			done = append(done, stepMoveJobComplete)
		}
		note := settle(t, env, opDiskMove, in, done...)
		app, err := env.State().ReadApplied("web")
		if err != nil {
			t.Fatal(err)
		}
		_, serr := os.Stat(tgt.File)
		want := map[string]vmstore.MovedDisk{"data": {From: src.File, Disk: tgt}}
		if !pivoted {
			want = nil
		}
		if diff := cmp.Diff(want, app.Moved); diff != "" || (serr == nil) != pivoted {
			t.Errorf("pivoted %v (%s): moved (-want +got):\n%s target file: %v", pivoted, note, diff, serr)
		}
		uses := []string{tgt.File} // a move recorded on its target keeps its grant
		if !pivoted {
			uses = nil
		}
		if c, err := env.Confiner().Read("web"); err != nil || !slices.Equal(c.Uses, uses) {
			t.Errorf("pivoted %v: the grants left: %+v %v", pivoted, c, err)
		}
	}
}

// TestNBDBitmaps: an export reads the node's newest export bitmap unless
// there is none or it is inconsistent, and always starts the next one.
func TestNBDBitmaps(t *testing.T) {
	node := func(bms ...qmp.DirtyBitmap) []qmp.BlockNode {
		return []qmp.BlockNode{{NodeName: "other", DirtyBitmaps: []qmp.DirtyBitmap{{Name: "vmsup-nbd-9"}}},
			{NodeName: "n", DirtyBitmaps: bms}}
	}
	for _, c := range []struct {
		name           string
		nodes          []qmp.BlockNode
		format         string
		old, next, why string
	}{
		{"raw", node(), spec.FormatRaw, "", "", "the image is raw"},
		{"first", node(), spec.FormatQcow2, "", "vmsup-nbd-0", "no earlier export"},
		{"newest", node(qmp.DirtyBitmap{Name: "vmsup-nbd-1"}, qmp.DirtyBitmap{Name: "vmsup-nbd-3"}, qmp.DirtyBitmap{Name: "backup-x"}),
			spec.FormatQcow2, "vmsup-nbd-3", "vmsup-nbd-4", ""},
		{"inconsistent", node(qmp.DirtyBitmap{Name: "vmsup-nbd-2", Inconsistent: true}), spec.FormatQcow2, "", "vmsup-nbd-3", "inconsistent"},
	} {
		old, next, why := nbdBitmaps(c.nodes, "n", c.format)
		if old != c.old || next != c.next || !strings.Contains(why, c.why) || (c.why == "") != (why == "") {
			t.Errorf("%s: got %q %q %q", c.name, old, next, why)
		}
	}
}

// TestMoveTarget: a target keeps the source's device side, and what
// cannot be a target is refused.
func TestMoveTarget(t *testing.T) {
	src := spec.Disk{Name: "data", Type: spec.DiskFile, File: "/images/data.qcow2", Format: spec.FormatQcow2,
		Bus: spec.BusVirtio, Serial: "S1", BootIndex: 2}
	rbd := &spec.Disk{Type: spec.DiskRBD, Pool: "p", Image: "i"}
	for _, c := range []struct {
		name string
		o    MoveOptions
		err  string
	}{
		{"path", MoveOptions{To: "/images/new.qcow2"}, ""},
		{"spec", MoveOptions{Spec: rbd}, ""},
		{"both", MoveOptions{To: "/images/new.qcow2", Spec: rbd}, "exactly one"},
		{"neither", MoveOptions{}, "exactly one"},
		{"same", MoveOptions{To: src.File}, "already on"},
		{"another disk", MoveOptions{Spec: &spec.Disk{Name: "other", Type: spec.DiskRBD, Pool: "p", Image: "i"}}, `names disk "other"`},
		{"read-only", MoveOptions{Spec: &spec.Disk{Type: spec.DiskRBD, Pool: "p", Image: "i", ReadOnly: true}}, "read-only"},
	} {
		got, err := moveTarget("web", src, c.o)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want %q", c.name, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err == "" && (got.Name != "data" || got.Serial != "S1" || got.BootIndex != 2 || got.Bus != src.Bus):
			t.Errorf("%s: the device side was not kept: %+v", c.name, got)
		}
	}
}

// TestMemorySnapshottable: a memory state is refused for a VM whose
// devices the next boot would not make again.
func TestMemorySnapshottable(t *testing.T) {
	for _, c := range []struct {
		name string
		app  vmstore.Applied
		ok   bool
	}{
		{"as booted", vmstore.Applied{}, true},
		{"nic attached", vmstore.Applied{AttachedNICs: []spec.NIC{{Name: "n"}}}, false},
		{"resized", vmstore.Applied{Resized: &vmstore.Resized{}}, false},
		{"replugged", vmstore.Applied{Replugged: true}, false},
		{"migrated", vmstore.Applied{MigratedFrom: "local"}, false},
	} {
		if err := memorySnapshottable(&c.app); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// The devices are the spec's, not the start's generation: a restart
	// with the same spec keeps the fingerprint.
	a := &vmstore.Applied{Spec: []byte(`{"name":"web"}`), Generation: 1}
	fp := devicesOf(a)
	a.Generation = 5
	if !sameDevices(fp, a) {
		t.Error("a new generation of the same spec does not fit its memory state")
	}
	a.Spec = []byte(`{"name":"web","memory":"2G"}`)
	if sameDevices(fp, a) {
		t.Error("another spec fits the memory state")
	}
}
