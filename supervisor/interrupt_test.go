package supervisor_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestInterruptedDown: a down cancelled while the guest is given time to
// power off (Ctrl-C) says it was interrupted and what it left: the VM runs
// on, nothing was killed, no kill is recorded, and the next clean stop is
// recorded as the stop it was, not as "killed by vmsup" (which a real kill
// still is). The same guest
// serves two smaller checks first: EventsSince gives a caller that
// subscribes after the start the "started" event, and the guest agent's
// commands on a paused VM say so at once instead of timing out.
func TestInterruptedDown(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	f := guestFile(t, t.TempDir(), "intr", `stop_timeout = "120s"`)
	t0 := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Kill(context.Background(), "intr") })

	eventsSinceStart(t, ctx, sup, t0)

	st, _ := sup.Status(ctx, "intr")
	sh := supervisortest.Shell(t, ctx, st)
	pausedAgent(t, ctx, sup)

	// The guest ignores the power button from here on.
	if out, code, err := sh.Run(ctx, "kill $(pidof acpid)"); err != nil || code != 0 {
		t.Fatalf("kill acpid: %d %v %s", code, err, out)
	}
	dctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(3*time.Second, cancel)
	waited := false
	_, err := sup.DownWith(dctx, "intr", supervisor.DownOptions{Waiting: func(time.Duration, time.Duration) { waited = true }})
	want := `vm "intr": interrupted: it is still running (its guest was asked to power off; nothing was killed)`
	if err == nil || err.Error() != want || !errors.Is(err, supervisor.ErrInterrupted) {
		t.Errorf("interrupted down: %v\n want %s (ErrInterrupted)", err, want)
	}
	if !waited {
		t.Errorf("down was not interrupted while waiting for the guest")
	}
	if st, err := sup.Status(ctx, "intr"); err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("after the interrupted down: %+v %v, want running", st, err)
	}
	if _, err := os.Stat(filepath.Join(root, "records", "intr", "kill-requested")); err == nil {
		t.Errorf("an interrupted down that killed nothing left a kill mark")
	}

	// The guest obeys the button again: a clean ACPI stop.
	if out, code, err := sh.Run(ctx, "acpid -c /etc/acpi -l /run/acpid.log; for i in $(seq 60); do "+
		"ls -l /proc/$(pidof acpid)/fd 2>/dev/null | grep -q /dev/input/event && break; sleep 0.05; done"); err != nil || code != 0 {
		t.Fatalf("start acpid: %d %v %s", code, err, out)
	}
	sh.Close() // a console client that does not read would stall the guest's output
	dr, err := sup.Down(ctx, "intr")
	if err != nil || dr.Step != supervisor.StoppedACPI {
		t.Fatalf("clean down: %+v %v, want acpi", dr, err)
	}
	var last supervisor.Event
	err = sup.FollowEvents(ctx, []string{"intr"}, t0, false, func(e supervisor.Event) error {
		if e.Source == "vmsup" && (e.Kind == supervisor.EventStopped || e.Kind == supervisor.EventCrashed) {
			last = e
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if last.Kind != supervisor.EventStopped || last.Reason != "guest-shutdown" {
		t.Errorf("the clean stop is recorded as %s (%s), want stopped (guest-shutdown)", last.Kind, last.Reason)
	}

	// A kill vmsup sends is still recorded as one, not as a crash.
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if dr, err := sup.Kill(ctx, "intr"); err != nil || dr.Step != supervisor.StoppedKill {
		t.Fatalf("kill: %+v %v", dr, err)
	}
	last = supervisor.Event{}
	for deadline := time.Now().Add(30 * time.Second); last.Kind == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_ = sup.FollowEvents(ctx, []string{"intr"}, t1, false, func(e supervisor.Event) error {
			if e.Source == "vmsup" && (e.Kind == supervisor.EventStopped || e.Kind == supervisor.EventCrashed) {
				last = e
			}
			return nil
		})
	}
	if last.Kind != supervisor.EventStopped || last.Reason != "killed by vmsup" {
		t.Errorf("vmsup's kill is recorded as %s (%s), want stopped (killed by vmsup)", last.Kind, last.Reason)
	}
}

// pausedAgent: the guest agent's commands on a paused VM fail at once,
// saying why and what to do.
func pausedAgent(t *testing.T, ctx context.Context, sup *supervisor.Supervisor) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if a, err := sup.GuestPing(ctx, "intr"); err == nil && a.Responding {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("guest agent never answered: %+v %v", a, err)
		}
	}
	if err := sup.Pause(ctx, "intr"); err != nil {
		t.Fatal(err)
	}
	want := `vm "intr": paused: the guest agent cannot answer while the VM is paused (vmsup resume intr)`
	checks := map[string]func(context.Context) error{
		"exec": func(ctx context.Context) error { _, err := sup.Exec(ctx, "intr", []string{"true"}, 0); return err },
		"cp": func(ctx context.Context) error {
			_, err := sup.CopyFromGuest(ctx, "intr", "/init", &discard{}, supervisor.CopyOptions{})
			return err
		},
		"ping": func(ctx context.Context) error { _, err := sup.GuestPing(ctx, "intr"); return err },
	}
	for name, fn := range checks {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		err := fn(cctx)
		cancel()
		if err == nil || err.Error() != want || time.Since(start) > 3*time.Second {
			t.Errorf("%s on a paused VM: %v after %s\n want at once: %s", name, err, time.Since(start).Round(time.Millisecond), want)
		}
	}
	if err := sup.Resume(ctx, "intr"); err != nil {
		t.Fatal(err)
	}
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }
