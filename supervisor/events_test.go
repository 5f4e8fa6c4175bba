package supervisor_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestEvents: a guest's pause, resume and reboot, its stop and a crash are
// in `vmsup events`, read afterwards with no reader running at the time;
// readers that follow see them as they come, a follower killed with SIGKILL
// takes nothing from the others or from vmsup's own commands, and the
// library's Events serves several callers at once.
func TestEvents(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	f := guestFile(t, t.TempDir(), "evts", "")
	t0 := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Kill(context.Background(), "evts") })
	st, _ := sup.Status(ctx, "evts")
	g := bootGuest(t, ctx, st)

	// Followers: two through the library, one through the CLI (killed).
	var mu sync.Mutex
	seen := map[int][]string{}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	for i := range 2 {
		evs, err := sup.Events(fctx, "evts")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for e := range evs {
				mu.Lock()
				seen[i] = append(seen[i], e.Kind)
				mu.Unlock()
			}
		}()
	}
	cli := exec.Command(vmsupBin, "--root", root, "--systemd-bus", env.Systemd.BusAddress, "events", "-f", "evts")
	out, _ := cli.StdoutPipe()
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	cliSeen := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			cliSeen <- sc.Text()
		}
	}()

	if err := sup.Pause(ctx, "evts"); err != nil {
		t.Fatal(err)
	}
	waitLine(t, cliSeen, "qemu   STOP")
	cli.Process.Signal(syscall.SIGKILL)
	cli.Wait()
	if err := sup.Resume(ctx, "evts"); err != nil {
		t.Fatalf("resume with a follower just killed: %v", err)
	}
	if _, _, err := g.sh.Run(ctx, "(sleep 0.5; reboot -f) </dev/null >/dev/null 2>&1 & true"); err != nil {
		t.Fatal(err)
	}
	g.sh.Close()                                                         // a console client that does not read would stall the booting guest's output
	waitMarkers(t, st.ConsoleLog, testenv.ShellMarker, 2, 2*time.Minute) // up again after the reboot
	if _, err := sup.Down(ctx, "evts"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := range 2 {
		for {
			mu.Lock()
			got := seen[i]
			mu.Unlock()
			if inOrder(got, []string{"STOP", "RESUME", "RESET", "SHUTDOWN", "stopped"}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("follower %d saw %q, want STOP RESUME RESET ... stopped", i, got)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// A crash: QEMU killed by a signal that vmsup did not send.
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, st, testenv.ReadyMarker, 2*time.Minute)
	for _, pid := range qemuPIDs(t, "evts") {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	waitState(t, ctx, sup, "evts", supervisor.StateCrashed, 30*time.Second)

	// After the fact, with no reader running at the time.
	var got []string
	err := sup.FollowEvents(ctx, []string{"evts"}, t0, false, func(e supervisor.Event) error {
		s := e.Source + ":" + e.Kind
		if e.Reason != "" {
			s += "(" + e.Reason + ")"
		}
		if e.Kind == supervisor.EventCrashed {
			s += "(" + e.Data["exit_status"].(string) + ")"
		}
		got = append(got, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vmsup:started", "qemu:STOP", "qemu:RESUME", "qemu:RESET(guest-reset)", "qemu:POWERDOWN",
		"qemu:SHUTDOWN(guest-shutdown)", "vmsup:stopped(guest-shutdown)", "vmsup:started", "vmsup:crashed(KILL)"}
	if !inOrder(got, want) {
		t.Errorf("history:\n got  %q\n want %q in this order", got, want)
	}
	r := exec.Command(vmsupBin, "--root", root, "--systemd-bus", env.Systemd.BusAddress, "events", "--json", "evts")
	b, err := r.Output()
	if err != nil || strings.Count(string(b), "\n") != len(got) || !strings.Contains(string(b), `"event":"RESET","reason":"guest-reset"`) {
		t.Errorf("vmsup events --json: %v\n%s", err, b)
	}
}

// waitLine waits for a line containing want on lines.
func waitLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case l := <-lines:
			if strings.Contains(l, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no line with %q", want)
		}
	}
}

// waitMarkers waits until the log holds marker n times.
func waitMarkers(t *testing.T, log, marker string, n int, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if b, _ := os.ReadFile(log); strings.Count(string(b), marker) >= n {
			return
		}
	}
	b, _ := os.ReadFile(log)
	t.Fatalf("%s: %q not %d times within %s:\n%s", log, marker, n, d, tail(string(b), 2000))
}

func inOrder(got, want []string) bool { return supervisortest.InOrder(got, want) }
