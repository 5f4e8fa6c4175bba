package startplan

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// concern is a test contributor of one step, named name; a reuser is one
// that also reuses, noting it in log and failing with err.
type concern struct {
	name string
	log  *[]string
	err  error
}

func (c concern) Steps(_ *spec.File, plan *Plan) []steps.Step {
	plan.AddUnit(func(u *units.Unit) { u.Description += c.name })
	return []steps.Step{{Name: c.name, Do: func(context.Context) error { return nil }}}
}

type reuser struct{ concern }

func (r reuser) Reuse(_ *spec.File, plan *Plan) error {
	*r.log = append(*r.log, r.name)
	plan.AddArgv(func(o *qemuargs.Options) { o.CPU += r.name })
	return r.err
}

// TestContributors: the steps of every contributor in order, their unit
// options applied in the order added; Reuse asks only the reusers, in
// order, and stops at the first refusal.
func TestContributors(t *testing.T) {
	var log []string
	boom := errors.New("boom")
	cs := []Contributor{reuser{concern{"a", &log, nil}}, concern{"b", &log, nil}, reuser{concern{"c", &log, boom}}, reuser{concern{"d", &log, nil}}}
	var plan Plan
	if got := steps.Names(Steps(&spec.File{}, &plan, cs...)); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("steps %q", got)
	}
	var u units.Unit
	plan.ApplyUnit(&u)
	if u.Description != "abcd" {
		t.Errorf("unit options applied as %q, want abcd", u.Description)
	}
	if err := Reuse(&spec.File{}, &plan, cs...); !errors.Is(err, boom) {
		t.Fatalf("reuse: %v", err)
	}
	if !slices.Equal(log, []string{"a", "c"}) {
		t.Errorf("reused %q, want a and c (b is no reuser, d comes after the refusal)", log)
	}
	opts := plan.ArgvOptions()
	opts = append(opts, func(o *qemuargs.Options) { o.CPU += "x" })
	var o qemuargs.Options
	for _, fn := range plan.ArgvOptions() {
		fn(&o)
	}
	if o.CPU != "ac" || len(opts) != 3 {
		t.Errorf("argv options gave %q (want ac); ArgvOptions must be a copy", o.CPU)
	}
}

// TestBootFile: a start boots the file's disks moved where a move put them
// (while the file still names the source they were moved from), then the
// carried ones, and its kernel and initrd from their copies; with nothing
// of these, the file itself.
func TestBootFile(t *testing.T) {
	f := &spec.File{VM: spec.VM{Name: "vm", Disks: []spec.Disk{
		{Name: "root", Type: spec.DiskFile, File: "/img/root.qcow2", Format: spec.FormatQcow2},
		{Name: "data", Type: spec.DiskFile, File: "/img/data.raw", Format: spec.FormatRaw},
	}}}
	if got := (Boot{}).File(f); got != f {
		t.Errorf("nothing to change: got a copy")
	}
	moved := map[string]vmstore.MovedDisk{
		"data": {From: vmstore.DiskSource(f.VM.Disks[1]), Disk: spec.Disk{Name: "data", Type: spec.DiskFile, File: "/new/data.raw", Format: spec.FormatRaw}},
		"root": {From: "/elsewhere.qcow2", Disk: spec.Disk{Name: "root", Type: spec.DiskFile, File: "/new/root.qcow2"}},
	}
	carried := []spec.Disk{{Name: "hot", Type: spec.DiskFile, File: "/img/hot.raw", Format: spec.FormatRaw}}
	g := (Boot{Moved: moved, Carried: carried}).File(f)
	var files []string
	for _, d := range g.VM.Disks {
		files = append(files, d.File)
	}
	if want := []string{"/img/root.qcow2", "/new/data.raw", "/img/hot.raw"}; !slices.Equal(files, want) {
		t.Errorf("boot disks %q, want %q", files, want)
	}
	if len(f.VM.Disks) != 2 || f.VM.Disks[1].File != "/img/data.raw" {
		t.Errorf("the file changed: %+v", f.VM.Disks)
	}
	f.VM.Boot = spec.Boot{Kernel: "/img/vmlinux", Initrd: "/img/initrd", Cmdline: "console=ttyS0"}
	for _, b := range []Boot{{Kernel: "/vms/vm/boot/kernel", Initrd: "/vms/vm/boot/initrd"},
		{Kernel: "/vms/vm/boot/kernel", Initrd: "/vms/vm/boot/initrd", Moved: moved}} {
		g := b.File(f)
		if want := (spec.Boot{Kernel: "/vms/vm/boot/kernel", Initrd: "/vms/vm/boot/initrd", Cmdline: "console=ttyS0"}); g.VM.Boot != want ||
			len(g.VM.Disks) != 2 {
			t.Errorf("booting from the copies: %+v, %d disks", g.VM.Boot, len(g.VM.Disks))
		}
	}
	if f.VM.Boot.Kernel != "/img/vmlinux" || f.VM.Boot.Initrd != "/img/initrd" {
		t.Errorf("the file changed: %+v", f.VM.Boot)
	}
}
