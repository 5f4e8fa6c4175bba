package livemigrate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// TestMigratable: what the destination, built from the spec, could not
// recreate (or reach, on another host) is refused, saying what to do.
func TestMigratable(t *testing.T) {
	view := func(edit func(v *vmstore.View)) *vmstore.View {
		v := &vmstore.View{Applied: &vmstore.Applied{}, Tree: &snapshottree.Tree{},
			Disks: []vmstore.Disk{{Disk: spec.Disk{File: "/img/a.qcow2"}}}, NICs: []vmstore.NIC{{}}}
		if edit != nil {
			edit(v)
		}
		return v
	}
	snapshots := func(v *vmstore.View) { v.Tree.Snapshots = []snapshottree.Snapshot{{Tag: "s1"}} }
	moved := func(v *vmstore.View) { v.Disks[0].MovedFrom = "/old/a.qcow2" }
	cases := []struct {
		name  string
		v     *vmstore.View
		local bool
		want  string // "" for migratable
	}{
		{"plain", view(nil), false, ""},
		{"plain, local", view(nil), true, ""},
		{"snapshots", view(snapshots), false, "the VM has snapshots"},
		{"snapshots, local", view(snapshots), true, ""},
		{"moved disk", view(moved), false, "a disk was moved"},
		{"moved disk, local", view(moved), true, ""},
		{"attached disk", view(func(v *vmstore.View) {
			v.Disks = append(v.Disks, vmstore.Disk{Attached: true})
		}), true, "1 hot-plugged disk(s) and 0 NIC(s)"},
		{"attached NIC", view(func(v *vmstore.View) {
			v.NICs = append(v.NICs, vmstore.NIC{Attached: true})
		}), false, "0 hot-plugged disk(s) and 1 NIC(s)"},
		{"replugged", view(func(v *vmstore.View) { v.Applied.Replugged = true }), false, "vmsup apply plugged or unplugged"},
		{"resized", view(func(v *vmstore.View) {
			v.Applied.Resized = &vmstore.Resized{CPUs: 3, Memory: 512 * spec.MiB}
		}), true, "3 vCPUs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := migratable(c.v, c.local)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// TestHandOver: the sockets still in the incoming directory take their
// usual names, qmp.sock first; each is a step whether it was still there
// or not (a recovery finishes what a killed hand-over left).
func TestHandOver(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "incoming-abc")
	if err := os.Mkdir(in, 0o700); err != nil {
		t.Fatal(err)
	}
	// Killed after qmp.sock was handed over: the rest are still there.
	for _, f := range []string{"events.sock", "console.sock", "qga.sock"} {
		if err := os.WriteFile(filepath.Join(in, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var steps []operation.Step
	if err := handOver(in, dir, func(s operation.Step) { steps = append(steps, s) }); err != nil {
		t.Fatal(err)
	}
	want := []operation.Step{"hand-over qmp.sock", "hand-over events.sock", "hand-over console.sock", "hand-over qga.sock", "hand-over vnc.sock"}
	if diff := cmp.Diff(want, steps); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	for _, f := range []string{"events.sock", "console.sock", "qga.sock"} {
		if !exists(filepath.Join(dir, f)) || exists(filepath.Join(in, f)) {
			t.Errorf("%s not handed over", f)
		}
	}
	if got := HandOverSteps(); len(got) != len(want)+1 || got[0] != string(want[0]) || got[len(got)-1] != string(stepHandOverRecord) {
		t.Errorf("HandOverSteps = %q", got)
	}
}

// TestIncomingDir: recovery finds the newest incoming directory (an older
// one is a previous destination's that its QEMU left).
func TestIncomingDir(t *testing.T) {
	p := vmstore.Paths{Dir: t.TempDir()}
	if got := incomingDir(p); got != "" {
		t.Fatalf("no incoming directory: got %q", got)
	}
	old, newer := filepath.Join(p.Dir, "incoming-old"), filepath.Join(p.Dir, "incoming-new")
	for _, d := range []string{newer, old} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if got := incomingDir(p); got != newer {
		t.Errorf("incomingDir = %q, want %q", got, newer)
	}
}

// TestVMErr: an error names its VM once.
func TestVMErr(t *testing.T) {
	base := errors.New("boom")
	e := vmerr.Wrap("web", base)
	if got := vmerr.Wrap("web", e).Error(); got != `vm "web": boom` {
		t.Errorf("named twice: %q", got)
	}
	me := &Error{VM: "web", Step: "prepare", Running: "source", Err: base}
	if got := vmerr.Wrap("web", me); got != error(me) {
		t.Errorf("a migration's error is wrapped again: %v", got)
	}
	if !errors.Is(vmerr.Wrap("db", me), base) {
		t.Error("the cause is lost")
	}
}
