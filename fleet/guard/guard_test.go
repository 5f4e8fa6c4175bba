package guard_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"

	"github.com/vmsup/vmsup/fleet/guard"
	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// TestGuard, in a real systemd: a guard moved forward before its deadline
// kills nothing; one left alone kills its units (and only those) at its
// deadline, give or take systemd's scheduling; a second guard (a new
// agent) stops the first's timer once its own is armed; disarming leaves
// no timer.
func TestGuard(t *testing.T) {
	testenv.SkipUnlessRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "vmsup-guard-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sys, err := testenv.StartSystemd(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Stop()
	conn, err := sys.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, u := range []string{"vmsup-a.service", "vmsup-b@migrated.service", "vmsup-local.service"} {
		sleeper(ctx, t, conn, u)
	}
	g := &guard.Guard{SD: conn, Prefix: "vmsup-fleet-guard", Systemctl: "/bin/systemctl", Log: slog.New(slog.DiscardHandler)}
	fleetUnits := []string{"vmsup-a.service", "vmsup-a@migrated.service", "vmsup-b.service", "vmsup-b@migrated.service"}
	if err := g.Arm(ctx, time.Now().Add(time.Second), fleetUnits); err != nil {
		t.Fatal(err)
	}
	// Moved forward every 300 ms for 2 s: its first deadline passes.
	for range 7 {
		time.Sleep(300 * time.Millisecond)
		if err := g.Arm(ctx, time.Now().Add(time.Second), fleetUnits); err != nil {
			t.Fatal(err)
		}
	}
	if dead := gone(ctx, t, conn, "vmsup-a.service", "vmsup-b@migrated.service"); len(dead) > 0 {
		t.Fatalf("%v killed though the guard was moved forward", dead)
	}
	if n := timers(ctx, t, conn); n != 1 {
		t.Fatalf("%d guard timers; want the one armed", n)
	}
	// A new agent's guard: its arming stops the old one's timer.
	g2 := &guard.Guard{SD: conn, Prefix: "vmsup-fleet-guard", Systemctl: "/bin/systemctl"}
	deadline := time.Now().Add(1500 * time.Millisecond)
	if err := g2.Arm(ctx, deadline, fleetUnits); err != nil {
		t.Fatal(err)
	}
	if n := timers(ctx, t, conn); n != 1 {
		t.Fatalf("%d guard timers after a second guard armed; want its own only", n)
	}
	// Left alone: at its deadline the fleet units die, the local one runs on.
	for len(gone(ctx, t, conn, "vmsup-a.service", "vmsup-b@migrated.service")) < 2 {
		if time.Since(deadline) > 3*time.Second {
			t.Fatalf("fleet units still run %s after the deadline", time.Since(deadline))
		}
		time.Sleep(20 * time.Millisecond)
	}
	late := time.Since(deadline)
	t.Logf("units killed %s after the guard's deadline", late.Round(time.Millisecond))
	if late < -50*time.Millisecond {
		t.Errorf("killed %s before the deadline", -late)
	}
	if dead := gone(ctx, t, conn, "vmsup-local.service"); len(dead) > 0 {
		t.Errorf("the guard killed a unit it was not given")
	}
	if err := g2.Arm(ctx, time.Now().Add(time.Second), nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := timers(ctx, t, conn); n != 0 {
		t.Errorf("%d guard timers after disarming", n)
	}
}

// sleeper starts a transient unit that sleeps.
func sleeper(ctx context.Context, t *testing.T, conn *sd.Conn, name string) {
	t.Helper()
	ch := make(chan string, 1)
	props := []sd.Property{sd.PropDescription("guard test"), sd.PropExecStart([]string{"/bin/sleep", "300"}, false)}
	if _, err := conn.StartTransientUnitContext(ctx, name, "fail", props, ch); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r != "done" {
		t.Fatalf("start %s: %s", name, r)
	}
}

// gone lists the units of names that no longer run.
func gone(ctx context.Context, t *testing.T, conn *sd.Conn, names ...string) []string {
	t.Helper()
	var out []string
	for _, n := range names {
		p, err := conn.GetUnitPropertyContext(ctx, n, "ActiveState")
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.Trim(p.Value.String(), `"`); s != "active" {
			out = append(out, n)
		}
	}
	return out
}

// timers counts the guard timers systemd has loaded.
func timers(ctx context.Context, t *testing.T, conn *sd.Conn) int {
	t.Helper()
	us, err := conn.ListUnitsByPatternsContext(ctx, nil, []string{"vmsup-fleet-guard-*.timer"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, u := range us {
		if u.ActiveState == "active" {
			n++
		}
	}
	return n
}
