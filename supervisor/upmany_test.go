package supervisor_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestUpMany: one Up of several files starts them concurrently, each on its
// own: a VM QEMU refuses does not keep the others down, results come in file
// order, and the error names the VM that failed.
func TestUpMany(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	sup := newSup(t, "")
	dir := t.TempDir()
	files := []*spec.File{
		guestFile(t, dir, "many1", "stop_timeout = \"1s\""),
		refusedFile(t, dir, "manybad", "stop_timeout = \"1s\""),
		guestFile(t, dir, "many2", "stop_timeout = \"1s\""),
	}
	res, err := sup.Up(ctx, files...)
	for _, n := range []string{"many1", "many2", "manybad"} {
		defer sup.Down(ctx, n)
	}
	if err == nil || !strings.Contains(err.Error(), `vm "manybad"`) || strings.Contains(err.Error(), `vm "many1"`) {
		t.Fatalf("error: %v", err)
	}
	if len(res) != 2 || res[0].VM != "many1" || res[1].VM != "many2" || res[0].Action != supervisor.Started {
		t.Fatalf("results: %+v", res)
	}
	for _, n := range []string{"many1", "many2"} {
		if st, _ := sup.Status(ctx, n); st.State != supervisor.StateRunning && st.State != supervisor.StateStarting {
			t.Fatalf("%s: %+v", n, st)
		}
	}
	if out, _ := env.Systemd.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-manybad.service"); strings.TrimSpace(string(out)) != "" {
		t.Fatalf("unit of the refused VM left: %s", out)
	}
}
