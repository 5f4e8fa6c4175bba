package supervisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/units"
)

// TestOrphanUnitStop: "systemctl stop" of an orphan vmsup-NAME@migrated
// unit (a migration destination nobody finished) runs its stop hooks, which
// must leave the live guest in vmsup-NAME.service alone: no power-off, its
// network kept. The orphan is made as a killed migration made them before
// the journal (a unit with the VM's hooks, bound to its own name).
func TestOrphanUnitStop(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	const vm = "orphan"
	f := counterGuest(t, t.TempDir(), vm, "")
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(context.Background(), vm)
	st, _ := sup.Status(ctx, vm)
	waitConsole(t, st, "VMSUP-COUNTER", 90*time.Second)
	sd, err := units.Connect(ctx, env.Systemd.BusAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	orphan := "vmsup-" + vm + "@migrated.service"
	hook := func(cmd string) []string {
		return []string{vmsupBin, cmd, "--root", root, "--unit", orphan, vm}
	}
	if err := sd.Start(ctx, units.Unit{Name: orphan, Argv: []string{"/bin/sleep", "600"}, DeviceAll: true,
		ExecStop: [][]string{hook("stop-hook")}, ExecStopPost: [][]string{hook("stop-post")},
		StopHooksPrivileged: true}); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Systemd.Systemctl(ctx, "stop", orphan); err != nil {
		t.Fatalf("systemctl stop %s: %v %s", orphan, err, out)
	}
	journal, _ := env.Systemd.Journal(ctx, orphan)
	if !strings.Contains(journal, "not-current") {
		t.Errorf("the orphan's stop hook did not say it left the guest alone; its journal:\n%s", tail(journal, 1500))
	}
	after, err := sup.Status(ctx, vm)
	if err != nil || after.State != supervisor.StateRunning || after.MainPID != st.MainPID {
		t.Fatalf("the live VM after stopping the orphan: %+v %v (before: pid %d)", after, err, st.MainPID)
	}
	n := lastCounter(t, st.ConsoleLog)
	waitCounterPast(t, st.ConsoleLog, n+5, 30*time.Second)
	if b, _ := os.ReadFile(filepath.Join(root, "vms", vm, "console.log")); strings.Contains(string(b), "reboot: Power down") {
		t.Fatal("the guest powered off")
	}
}

// counterGuest is guestFile for a guest that prints a counter.
func counterGuest(t testing.TB, dir, name, extra string) *spec.File {
	t.Helper()
	path := filepath.Join(dir, name+".toml")
	writeGuestTOML(t, path, name, extra)
	b, _ := os.ReadFile(path)
	b = []byte(strings.Replace(string(b), `cmdline = "console=ttyS0 no_timer_check"`, `cmdline = "console=ttyS0 no_timer_check vmsup.counter"`, 1))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
