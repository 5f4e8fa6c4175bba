package diskprep

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// TestPlan: rm keeps every disk image by default and names them; with
// --delete-disks it deletes only those vmsup made (never a user's file,
// nor a shared or read-only one, even if vmsup made it).
func TestPlanRemove(t *testing.T) {
	dir := t.TempDir()
	p := vmstore.Store{Root: dir}.Paths("vm")
	file := func(n string) string {
		f := filepath.Join(dir, n)
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	made, user, shared := file("made.qcow2"), file("user.qcow2"), file("shared.qcow2")
	if err := p.NoteMade(made, shared); err != nil {
		t.Fatal(err)
	}
	disk := func(f string, sh bool) vmstore.Disk {
		return vmstore.Disk{Disk: spec.Disk{Type: spec.DiskFile, File: f, Shared: sh}}
	}
	v := &vmstore.View{Disks: []vmstore.Disk{disk(made, false), disk(user, false), disk(shared, true),
		disk(filepath.Join(dir, "gone.qcow2"), false)}}
	keep, del := PlanRemove(v, p, false)
	if !slices.Equal(keep, []string{made, user, shared}) || del != nil {
		t.Fatalf("without --delete-disks: keep %q, delete %q", keep, del)
	}
	keep, del = PlanRemove(v, p, true)
	if !slices.Equal(keep, []string{user, shared}) || !slices.Equal(del, []string{made}) {
		t.Fatalf("with --delete-disks: keep %q, delete %q", keep, del)
	}
	if done, err := DeleteImages(del); err != nil || !slices.Equal(done, del) {
		t.Fatalf("delete: %q, %v", done, err)
	}
	if _, err := os.Stat(user); err != nil {
		t.Fatal("the user's image went")
	}
}
