package snapshottest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestCloneFromSnapshot: a clone started from a booted template's memory
// snapshot answers on its console without booting, far sooner than the
// template's cold boot did; it has its own UUID and disks (copy on write:
// its writes are not the template's); the template's snapshot cannot be
// removed while the clone stands on it. The clone is a VM like any other
// (cloneIsFirstClass), and the template starts again while it runs
// (templateRestarts).
func TestCloneFromSnapshot(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	dir := t.TempDir()
	body := fmt.Sprintf(`name = "tmpl"
memory = "128M"
accel = "tcg"
stop_timeout = "20s"

[[disk]]
name = "data"
file = %q
size = "8M"

[[nic]]
name = "net0"
forwards = ["tcp:127.0.0.1:0-:22"]

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, filepath.Join(dir, "data.raw"), env.Guest.Kernel, env.Guest.Initrd)
	path := filepath.Join(dir, "tmpl.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sup := supervisortest.New(t, env, "", vmsupBin)

	start := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "tmpl") })
	tst, err := sup.Status(ctx, "tmpl")
	if err != nil {
		t.Fatal(err)
	}
	sh := supervisortest.Shell(t, ctx, tst)
	answer(t, ctx, sh)
	cold := time.Since(start)
	if _, _, err := sh.Run(ctx, "printf TEMPLATE > /dev/vda && sync"); err != nil {
		t.Fatal(err)
	}
	sh.Close()
	if _, err := sup.Snapshot(ctx, "tmpl", "warm", supervisor.SnapshotOptions{Memory: true}); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	r, err := sup.UpFromSnapshot(ctx, "tmpl", "warm", "clone1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sup.Down(context.Background(), "clone1")
		sup.Remove(context.Background(), "clone1")
	})
	cst, err := sup.Status(ctx, "clone1")
	if err != nil {
		t.Fatal(err)
	}
	csh, err := testenv.DialConsole(ctx, cst.Console) // no boot, so no shell marker: it waits already
	if err != nil {
		t.Fatal(err)
	}
	defer csh.Close()
	answer(t, ctx, csh)
	warm := time.Since(start)
	t.Logf("cold boot to console answer %s; clone from the memory snapshot %s (%.2fx); %+v",
		cold.Round(time.Millisecond), warm.Round(time.Millisecond), warm.Seconds()/cold.Seconds(), r)
	if b, _ := os.ReadFile(cst.ConsoleLog); strings.Contains(string(b), "Linux version") {
		t.Fatalf("the clone booted:\n%s", supervisortest.Tail(string(b), 1500))
	}
	if cst.UUID == "" || cst.UUID == tst.UUID {
		t.Fatalf("clone UUID %q, template's %q", cst.UUID, tst.UUID)
	}
	// Copy on write: the clone reads the template's data and writes its own.
	out, _, err := csh.Run(ctx, "head -c 8 /dev/vda; echo; printf CLONEDAT > /dev/vda && sync && echo WROTE")
	if err != nil || !strings.Contains(out, "TEMPLATE") || !strings.Contains(out, "WROTE") {
		t.Fatalf("clone's disk: %q %v", out, err)
	}
	if raw, _ := os.ReadFile(filepath.Join(dir, "data.raw")); !strings.HasPrefix(string(raw), "TEMPLATE") {
		t.Fatalf("the template's image changed: %q", raw[:8])
	}
	if err := sup.RemoveSnapshot(ctx, "tmpl", "warm", nil); err == nil || !strings.Contains(err.Error(), "clone1") {
		t.Fatalf("removing the snapshot a clone stands on: %v", err)
	}
	if _, err := sup.UpFromSnapshot(ctx, "tmpl", "warm", "clone1"); err == nil {
		t.Fatal("a second clone1 was started")
	}
	csh.Close()
	cloneIsFirstClass(t, ctx, sup, r)
	templateRestarts(t, ctx, sup, f)
}

// cloneIsFirstClass: a clone has a file of its own (status names it and
// finds the clone in sync with it), the forwards it could not take are
// named, and after a down the clone's name brings it up again from that
// file; vmsup export writes a file plan finds in sync.
func cloneIsFirstClass(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, r supervisor.CloneResult) {
	t.Helper()
	if len(r.Dropped) != 1 || !strings.Contains(r.Dropped[0], "forward") {
		t.Errorf("the template's forward is not named as dropped: %q", r.Dropped)
	}
	st, err := sup.Status(ctx, "clone1")
	if err != nil {
		t.Fatal(err)
	}
	if st.SpecFile != r.File || st.Sync != supervisor.SyncInSync {
		t.Fatalf("clone's file %q (result %q), sync %q", st.SpecFile, r.File, st.Sync)
	}
	file, err := sup.FileOf("clone1")
	if err != nil || file != r.File {
		t.Fatalf("FileOf(clone1) = %q, %v; want %q", file, err, r.File)
	}
	exported, err := sup.Export("clone1")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "clone1.toml")
	if err := os.WriteFile(out, exported, 0o644); err != nil {
		t.Fatal(err)
	}
	ef, err := spec.Load(out)
	if err != nil {
		t.Fatalf("exported file: %v\n%s", err, exported)
	}
	if _, err := sup.Plan(ctx, ef); err == nil {
		t.Fatal("plan of an exported copy (another file) was not refused without --adopt")
	}
	if p, err := sup.PlanWith(ctx, ef, supervisor.PlanOptions{Adopt: true}); err != nil || !p.InSync {
		t.Fatalf("plan --adopt of the exported file: %+v %v", p, err)
	}
	if _, err := sup.Down(ctx, "clone1"); err != nil {
		t.Fatal(err)
	}
	cf, err := spec.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sup.Up(ctx, cf); err != nil || len(res) != 1 || res[0].Action != supervisor.Started {
		t.Fatalf("up of the clone's own file: %+v %v", res, err)
	}
}

// templateRestarts: the template goes down and comes up again from its
// file while a clone stands on its snapshot's images (the lock check looks
// at the overlay the template really opens, not the frozen base).
func templateRestarts(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, f *spec.File) {
	t.Helper()
	if _, err := sup.Down(ctx, "tmpl"); err != nil {
		t.Fatal(err)
	}
	if res, err := sup.Up(ctx, f); err != nil || len(res) != 1 || res[0].Action != supervisor.Started {
		t.Fatalf("the template does not start again while its clone runs: %+v %v", res, err)
	}
}

// answer runs a command on the guest's console and checks its answer.
func answer(t *testing.T, ctx context.Context, sh *testenv.GuestShell) {
	t.Helper()
	out, _, err := sh.Run(ctx, "echo READY-$((6*7))")
	if err != nil || !strings.Contains(out, "READY-42") {
		t.Fatalf("console: %q %v", out, err)
	}
}
