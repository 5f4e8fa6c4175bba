package snapshottest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestPlanAfterMove (issue 47): after `vmsup disk move` of a disk of the
// VM's file, the file as it was and the file edited to name the new image
// (as the move's note asks, its other keys as they were) both plan no
// change, status says "in sync" and up leaves the VM alone; a file naming
// a third image is a restart-class change from the new image. Down and up with the edited
// file boots from the new image, no longer recorded as moved.
func TestPlanAfterMove(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	dir := t.TempDir()
	sup := supervisortest.New(t, env, "", vmsupBin)
	images := filepath.Join(sup.Root(), "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "mpvm.toml")
	data, target := filepath.Join(dir, "data.raw"), filepath.Join(images, "data.qcow2")
	write := func(file string) *spec.File {
		t.Helper()
		supervisortest.WriteGuestTOML(t, env, path, "mpvm", fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nsize = \"16M\"\ncache = \"writeback\"\n", file))
		f, err := spec.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := write(data)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mpvm") })
	res, err := sup.MoveDisk(ctx, "mpvm", "data", supervisor.MoveOptions{To: target})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("move: %s", res.Note)
	if !strings.Contains(res.Note, "update the file") {
		t.Fatalf("the move's note does not ask for the file to be edited: %q", res.Note)
	}
	expectInSync(t, ctx, sup, f, "the file as it was")
	expectInSync(t, ctx, sup, write(target), "the file naming the new image")

	third := write(filepath.Join(images, "third.qcow2"))
	p, err := sup.Plan(ctx, third)
	if err != nil {
		t.Fatal(err)
	}
	if p.InSync || len(p.Changes) != 1 || p.Changes[0].Field != "disk[data].file" || p.Changes[0].Class != "restart" ||
		p.Changes[0].From != fmt.Sprintf("%q", target) {
		t.Fatalf("a file naming a third image plans %+v, want one restart of disk[data].file from %s", p.Changes, target)
	}

	edited := write(target)
	if _, err := sup.Down(ctx, "mpvm"); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, edited); err != nil {
		t.Fatal(err)
	}
	st, err := sup.Status(ctx, "mpvm")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.MovedDisks) != 0 || len(st.Disks) != 1 || st.Disks[0].Source != target || !openBy(st, target) {
		t.Fatalf("after down and up with the edited file: moved %v, disks %+v, %s open %v", st.MovedDisks, st.Disks, target, openBy(st, target))
	}
	expectInSync(t, ctx, sup, edited, "the edited file after a restart")
}

// expectInSync: f plans no change for its running VM, status calls it in
// sync (it reads the VM's file, f's path) and up leaves it alone.
func expectInSync(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, f *spec.File, what string) {
	t.Helper()
	p, err := sup.Plan(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if !p.InSync || len(p.Changes) != 0 {
		t.Fatalf("%s: plan shows %+v, want no change", what, p.Changes)
	}
	st, err := sup.Status(ctx, f.VM.Name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sync != supervisor.SyncInSync {
		t.Fatalf("%s: status says %q, want %q", what, st.Sync, supervisor.SyncInSync)
	}
	rs, err := sup.Up(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Action != supervisor.Unchanged {
		t.Fatalf("%s: up %+v, want unchanged", what, rs)
	}
}
