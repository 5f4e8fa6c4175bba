package upgradetest

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestUpgradeCrossHost: host A runs QEMU 7.2, host B QEMU 10 (put in place
// in its sandbox). A guest first started on A (pinned at pc-q35-7.2)
// migrates to B and runs there on QEMU 10, and back to A; a guest first
// started on B (pinned at pc-q35-10.0) is refused by A in the prepare
// step, naming its machine type, and runs on on B.
func TestUpgradeCrossHost(t *testing.T) {
	testenv.QEMU10Skip(t)
	t0 := time.Now()
	ctx := supervisortest.Context(t, 10*time.Minute)
	a, b := supervisortest.TwoHosts(t, env, vmsupBin)
	b.PutQEMU10(t)
	dir := t.TempDir()
	f72 := supervisortest.MigrationGuest(t, env, dir, "x72", "192M", filepath.Join(dir, "x72.raw"))
	f10 := supervisortest.MigrationGuest(t, env, dir, "x10", "192M", filepath.Join(dir, "x10.raw"))
	for _, u := range []struct {
		h *supervisortest.Host
		f *spec.File
	}{{a, f72}, {b, f10}} {
		if _, err := u.h.Sup.Up(ctx, u.f); err != nil {
			t.Fatalf("up on %s: %v", u.h.Name, err)
		}
	}
	t.Cleanup(func() {
		for _, h := range []*supervisortest.Host{a, b} {
			for _, n := range []string{"x72", "x10"} {
				h.Sup.Down(context.Background(), n)
			}
		}
	})
	qemu72, qemu10 := stat(t, env.QEMU), stat(t, testenv.QEMU10Binary())
	st72, st10 := status(t, ctx, a.Sup, "x72"), status(t, ctx, b.Sup, "x10")
	supervisortest.Shell(t, ctx, st72).Close()
	supervisortest.Shell(t, ctx, st10).Close()
	expectQEMU(t, "x72 on A", runningQEMU(t, ctx, a.SD, a.Sup, "x72"), qemu72, "7", "pc-q35-7.2")
	expectQEMU(t, "x10 on B", runningQEMU(t, ctx, b.SD, b.Sup, "x10"), qemu10, "10", "pc-q35-10.0")
	supervisortest.WriteGuestData(t, ctx, st72.Console, "vmsup-upgrade-x72")
	elapsed(t, "two hosts, a guest up on each", t0)

	// 7.2 -> 10: the pinned type runs on B's QEMU 10.
	n := supervisortest.LastCounter(t, st72.ConsoleLog)
	migrate(t, ctx, a, b, "x72")
	stB := status(t, ctx, b.Sup, "x72")
	expectQEMU(t, "x72 on B", runningQEMU(t, ctx, b.SD, b.Sup, "x72"), qemu10, "10", "pc-q35-7.2")
	supervisortest.CheckContinuous(t, supervisortest.WaitCounterPast(t, stB.ConsoleLog, n+10, 30*time.Second))
	if got := supervisortest.ReadGuestData(t, ctx, stB.Console, 17); got != "vmsup-upgrade-x72" {
		t.Fatalf("x72's data on B: %q", got)
	}

	// 10 -> 7.2 of a guest pinned at pc-q35-10.0: refused by A's prepare
	// step, naming the type; nothing moved.
	n = supervisortest.LastCounter(t, st10.ConsoleLog)
	t1 := time.Now()
	_, err := b.Sup.Migrate(ctx, "x10", supervisor.MigrateOptions{To: "A", Address: a.Addr, Transport: a.Transport(""), Dial: b.Dial})
	t.Logf("x10 B -> A after %s: %v", time.Since(t1).Round(time.Millisecond), err)
	var me *supervisor.MigrateError
	if err == nil || !strings.Contains(err.Error(), `"pc-q35-10.0"`) || !errors.As(err, &me) || me.Step != "prepare" || me.Running != "source" {
		t.Fatalf("x10 (pc-q35-10.0) to the QEMU 7.2 host: %v; want a refusal in the prepare step naming the machine type, the guest on the source", err)
	}
	if _, err := a.Sup.Status(ctx, "x10"); !errors.Is(err, supervisor.ErrNotFound) {
		t.Fatalf("A after the refusal: %v", err)
	}
	if j, _ := a.SD.Journal(ctx, "vmsup-x10.service"); strings.TrimSpace(j) != "" {
		t.Fatalf("A started a QEMU for x10 before refusing it:\n%s", j)
	}
	expectQEMU(t, "x10 on B after the refusal", runningQEMU(t, ctx, b.SD, b.Sup, "x10"), qemu10, "10", "pc-q35-10.0")
	supervisortest.CheckContinuous(t, supervisortest.WaitCounterPast(t, st10.ConsoleLog, n+5, 30*time.Second))

	// 10 -> 7.2 of the guest pinned at pc-q35-7.2: back onto A's 7.2.
	n = supervisortest.LastCounter(t, stB.ConsoleLog)
	migrate(t, ctx, b, a, "x72")
	stA := status(t, ctx, a.Sup, "x72")
	expectQEMU(t, "x72 back on A", runningQEMU(t, ctx, a.SD, a.Sup, "x72"), qemu72, "7", "pc-q35-7.2")
	supervisortest.CheckContinuous(t, supervisortest.WaitCounterPast(t, stA.ConsoleLog, n+10, 30*time.Second))
	if got := supervisortest.ReadGuestData(t, ctx, stA.Console, 17); got != "vmsup-upgrade-x72" {
		t.Fatalf("x72's data back on A: %q", got)
	}
	elapsed(t, "TestUpgradeCrossHost", t0)
}

// migrate moves VM name from host from to host to, and checks it runs on
// to only.
func migrate(t *testing.T, ctx context.Context, from, to *supervisortest.Host, name string) {
	t.Helper()
	t0 := time.Now()
	res, err := from.Sup.Migrate(ctx, name, supervisor.MigrateOptions{To: to.Name, Address: to.Addr, Transport: to.Transport(""), Dial: from.Dial})
	if err != nil {
		t.Fatalf("%s %s -> %s: %v", name, from.Name, to.Name, err)
	}
	t.Logf("%s %s -> %s in %s: downtime %s, %d bytes", name, from.Name, to.Name, time.Since(t0).Round(time.Millisecond), res.Downtime, res.Transferred)
	if _, err := from.Sup.Status(ctx, name); !errors.Is(err, supervisor.ErrNotFound) {
		t.Fatalf("%s still on %s after its migration: %v", name, from.Name, err)
	}
}

// status is running VM name's status on sup.
func status(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, name string) supervisor.Status {
	t.Helper()
	st, err := sup.Status(ctx, name)
	if err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("%s: %+v %v", name, st, err)
	}
	return st
}
