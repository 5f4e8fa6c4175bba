package supervisor_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestRestart: a changed file is applied to a running VM by a restart; a
// change QEMU refuses brings the previous spec back up, and says so.
func TestRestart(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	sup := newSup(t, "")
	dir := t.TempDir()
	path := filepath.Join(dir, "rs.toml")
	load := func(extra string) *spec.File {
		t.Helper()
		writeGuestTOML(t, path, "rs", "stop_timeout = \"1s\"\nmax_cpus = 2\n"+extra)
		f, err := spec.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if _, err := sup.Up(ctx, load("cpus = 1")); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(ctx, "rs")
	two := load("cpus = 2")
	if res, err := sup.Up(ctx, two); err != nil || res[0].Action != supervisor.Changed {
		t.Fatalf("up of the changed file: %+v %v", res, err)
	}
	r, err := sup.Restart(ctx, two)
	if err != nil || r.Action != supervisor.Restarted {
		t.Fatalf("restart: %+v %v", r, err)
	}
	if st, _ := sup.Status(ctx, "rs"); st.State != supervisor.StateRunning || st.CPUs != 2 {
		t.Fatalf("after restart: %+v", st)
	}
	if out, err := sup.QMP(ctx, "rs", []byte(`{"execute":"query-cpus-fast"}`), false); err != nil || strings.Count(string(out), "cpu-index") != 2 {
		t.Fatalf("QEMU's vCPUs after restart: %s %v", out, err)
	}

	// QEMU refuses this one at start (its kernel is not one): the VM comes
	// back with the spec it ran with.
	bad := refusedFile(t, filepath.Dir(path), "rs", "stop_timeout = \"1s\"\nmax_cpus = 2\ncpus = 2")
	_, err = sup.Restart(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "the VM runs again with its previous spec") {
		t.Fatalf("restart with a spec QEMU refuses: %v", err)
	}
	t.Logf("as wanted: %v", err)
	if st, _ := sup.Status(ctx, "rs"); st.State != supervisor.StateRunning || st.CPUs != 2 {
		t.Fatalf("after the failed restart: %+v", st)
	}
	if res, err := sup.Up(ctx, two); err != nil || res[0].Action != supervisor.Unchanged {
		t.Fatalf("the running spec is not the previous one: %+v %v", res, err)
	}
	os.Remove(path)
}
