package apply

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// After `vmsup disk move`, a file edited to name the new image (as the
// move's note asks, its other keys left as they were) plans no change; so
// does the file still naming the old one; a third image is a change of
// the file from where the disk runs now (the new image).
func TestPlanAfterDiskMove(t *testing.T) {
	disk := func(file string) spec.Disk {
		return spec.Disk{Name: "root", File: file, Size: spec.Size(1 << 30), Image: "debian-12"}
	}
	vm := func(file string) *spec.VM {
		v := &spec.VM{Name: testVM, CPUs: 1, Memory: spec.Size(256 << 20), Disks: []spec.Disk{disk(file)}}
		v.FillDefaults()
		return v
	}
	w := newWorld(t, vm("/images/old.qcow2"))
	app := w.applied()
	// The target as the move makes it: the disk on the new file, without
	// the keys that only make an image, defaults filled (moveTarget).
	to := disk("/images/new.qcow2")
	to.Size, to.Image = 0, ""
	target, err := spec.CheckDisk("--to", to, testVM)
	if err != nil {
		t.Fatal(err)
	}
	app.Moved = map[string]vmstore.MovedDisk{"root": {From: "/images/old.qcow2", Disk: *target}}
	if err := w.store.RewriteApplied(app); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file, change string
	}{
		{"/images/new.qcow2", ""},
		{"/images/old.qcow2", ""},
		{"/images/third.qcow2", `disk[root].file "/images/new.qcow2" -> "/images/third.qcow2" (restart)`},
	} {
		res, err := w.a.plan(context.Background(), &spec.File{Path: "/etc/vmsup/web.toml", VM: *vm(tc.file)})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range res.Changes {
			got = append(got, fmt.Sprintf("%s %s -> %s (%s)", c.Field, c.From, c.To, c.Class))
		}
		if strings.Join(got, ", ") != tc.change {
			t.Errorf("file naming %s: changes %q, want %q", tc.file, got, tc.change)
		}
	}
}
