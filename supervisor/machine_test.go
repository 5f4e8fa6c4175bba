package supervisor_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// machineArg is the -machine value of the QEMU the unit runs (its
// /proc/PID/cmdline), without its options.
func machineArg(t *testing.T, unit string) string {
	t.Helper()
	pids, err := env.Systemd.HostPIDs(unit)
	if err != nil || len(pids) == 0 {
		t.Fatalf("%s: no QEMU: %v", unit, err)
	}
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if i := slices.Index(args, "-machine"); i >= 0 && i+1 < len(args) {
			m, _, _ := strings.Cut(args[i+1], ",")
			return m
		}
	}
	t.Fatalf("%s: no -machine in its QEMU's command line", unit)
	return ""
}

// TestMachinePinned: a VM started with machine = "q35" records the
// versioned type this QEMU resolves it to, runs it, and keeps it at a
// restart, a local migration and a start after a QEMU whose q35 means
// another type (a record of an older pin stands for that); plan shows a
// move to another versioned type as a restart; export writes the pin.
func TestMachinePinned(t *testing.T) {
	ctx := ctxT(t, 4*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	f := guestFile(t, t.TempDir(), "mpin", "")
	caps, err := sup.HostCaps(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	want := caps.QEMU.Aliases["q35"]
	if !spec.MachineVersioned(want) {
		t.Fatalf("the probe resolves q35 to %q", want)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "mpin") })
	state := vmstore.Store{Root: root}.Paths("mpin").State
	recorded := func() string {
		var app vmstore.Applied
		b, _ := os.ReadFile(state)
		_ = json.Unmarshal(b, &app)
		return app.Machine
	}
	if got, arg := recorded(), machineArg(t, "vmsup-mpin.service"); got != want || arg != want {
		t.Fatalf("first start: recorded %q, -machine %q; want %s", got, arg, want)
	}
	t.Logf("q35 pinned as %s", want)
	if out, err := sup.Export("mpin"); err != nil || !strings.Contains(string(out), want) {
		t.Errorf("export does not write %s: %v\n%s", want, err, out)
	}

	if r, err := sup.Restart(ctx, f); err != nil || r.Action != supervisor.Restarted {
		t.Fatalf("restart: %+v %v", r, err)
	}
	if arg := machineArg(t, "vmsup-mpin.service"); arg != want {
		t.Fatalf("after restart: -machine %q", arg)
	}
	res, err := sup.Migrate(ctx, "mpin", supervisor.MigrateOptions{Local: true})
	if err != nil {
		t.Fatal(err)
	}
	if arg := machineArg(t, res.Unit); arg != want || recorded() != want {
		t.Fatalf("after migrate --local: -machine %q, recorded %q", arg, recorded())
	}

	// An older pin (what a VM first started under an older QEMU has) is
	// kept while its file says q35, and plan shows a move to another.
	older := caps.MachineVersions("q35")[1]
	if _, err := sup.Down(ctx, "mpin"); err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	b, _ := os.ReadFile(state)
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	rec["machine"] = older
	if b, err = json.Marshal(rec); err == nil {
		err = os.WriteFile(state, b, 0o600)
	}
	if err != nil || recorded() != older {
		t.Fatalf("the record did not take %s: %v", older, err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	if arg := machineArg(t, "vmsup-mpin.service"); arg != older || recorded() != older {
		t.Fatalf("start with %s pinned: -machine %q, recorded %q", older, arg, recorded())
	}
	if p, err := sup.Plan(ctx, f); err != nil || !p.InSync {
		t.Fatalf("plan of the same file: %+v %v", p, err)
	}
	moved := guestFile(t, t.TempDir(), "mpin", `machine = "`+want+`"`)
	p, err := sup.PlanWith(ctx, moved, supervisor.PlanOptions{Adopt: true})
	if err != nil || len(p.Changes) != 1 || p.Changes[0].Class != plan.Restart || p.Changes[0].From != strconv.Quote(older) || p.Changes[0].To != strconv.Quote(want) {
		t.Fatalf("plan of a move to %s: %+v %v", want, p, err)
	}
	t.Logf("plan: %s", p.Changes[0])
}
