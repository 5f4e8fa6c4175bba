package failuretest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestPanic: a guest that panics (pvpanic) under on_panic = "restart" comes
// back, so does a QEMU killed by a signal under on_crash = "restart", and the
// restart after that passes restart_limit: the VM stays down and says why.
// Then on_panic = "preserve": the panicked guest stays, stopped and
// answering queries; resume is refused; down ends it at once. Everything is
// in the history, read afterwards.
func TestPanic(t *testing.T) {
	ctx := supervisortest.Context(t, 6*time.Minute)
	sup := supervisortest.New(t, env, "", vmsupBin)
	dir := t.TempDir()
	t0 := time.Now()
	data := fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nsize = \"32M\"\nformat = \"raw\"\n", filepath.Join(dir, "data.raw"))
	f := supervisortest.GuestFile(t, env, dir, "panic", "on_panic = \"restart\"\non_crash = \"restart\"\nrestart_limit = 2\nrestart_window = \"10m\"\n"+data)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Kill(context.Background(), "panic") })
	st, _ := sup.Status(ctx, "panic")
	sh := supervisortest.Shell(t, ctx, st)
	statsMove(t, ctx, sup, sh)
	panicGuest(t, ctx, sh)
	waitEvents(t, ctx, sup, "panic", t0, supervisor.EventStarted, 2)
	st = supervisortest.WaitState(t, ctx, sup, "panic", supervisor.StateRunning, time.Minute)
	testenv.WaitLog(t, st.ConsoleLog, testenv.ReadyMarker, 2*time.Minute) // the marker, seen again in the new QEMU's log

	pids, _ := env.Systemd.HostPIDs("vmsup-panic.service")
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	waitEvents(t, ctx, sup, "panic", t0, supervisor.EventStarted, 3)
	st = supervisortest.WaitState(t, ctx, sup, "panic", supervisor.StateRunning, time.Minute)
	panicGuest(t, ctx, supervisortest.Shell(t, ctx, st))
	waitEvents(t, ctx, sup, "panic", t0, supervisor.EventRestartLimit, 1)
	st = supervisortest.WaitState(t, ctx, sup, "panic", supervisor.StateShutOff, 30*time.Second)
	if !strings.Contains(st.Reason, "the guest panicked at") || !strings.Contains(st.Reason, "restart limit reached (2 within 10m0s)") {
		t.Errorf("status after the restart limit: reason %q", st.Reason)
	}

	// preserve: the panicked guest is kept.
	// (and a small console log, which the guest floods for a minute first).
	f = supervisortest.GuestFile(t, env, dir, "panic", "on_panic = \"preserve\"\n[console]\nlog_size = \"64K\"\nlog_files = 2\n")
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	st, _ = sup.Status(ctx, "panic")
	sh = supervisortest.Shell(t, ctx, st)
	sh = floodConsole(t, ctx, sh, st, 64<<10, 2)
	panicGuest(t, ctx, sh)
	supervisortest.WaitState(t, ctx, sup, "panic", supervisor.StatePanicked, time.Minute)
	if err := sup.Resume(ctx, "panic"); !errors.Is(err, supervisor.ErrPreserved) {
		t.Errorf("resume of a preserved guest: %v", err)
	}
	out, err := sup.QMP(ctx, "panic", []byte(`{"execute":"query-status"}`), false)
	if err != nil || !strings.Contains(string(out), `"guest-panicked"`) {
		t.Errorf("query-status of the preserved guest: %s %v", out, err)
	}
	ls, err := sup.List(ctx)
	if err != nil || len(ls) != 1 || ls[0].State != supervisor.StatePanicked {
		t.Errorf("list: %+v %v", ls, err)
	}
	start := time.Now()
	if res, err := sup.Down(ctx, "panic"); err != nil || res.Step != supervisor.StoppedQuit {
		t.Errorf("down of a panicked guest: %+v %v", res, err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("down of a panicked guest took %s: it waited for a powerdown the guest cannot act on", d)
	}

	var got []string
	err = sup.FollowEvents(ctx, []string{"panic"}, t0, false, func(e supervisor.Event) error {
		got = append(got, e.Source+":"+e.Kind)
		return nil
	})
	want := []string{"vmsup:started", "qemu:GUEST_PANICKED", "vmsup:panicked", "vmsup:restarting",
		"vmsup:started", "vmsup:crashed", "vmsup:restarting",
		"vmsup:started", "qemu:GUEST_PANICKED", "vmsup:panicked", "vmsup:restart-limit",
		"vmsup:started", "qemu:GUEST_PANICKED", "vmsup:stopped"}
	if err != nil || !supervisortest.InOrder(got, want) {
		t.Errorf("history: %v\n got  %q\n want %q in this order", err, got, want)
	}
}

// statsMove: a dd of 8 MiB in the guest raises its disk's written bytes
// by at least that; CPU time and uptime move too.
func statsMove(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, sh *testenv.GuestShell) {
	t.Helper()
	disk := func() (supervisor.VMStats, uint64) {
		vms, _, err := sup.Stats(ctx, "panic")
		if err != nil || len(vms) != 1 || !vms[0].Up {
			t.Fatalf("stats: %+v %v", vms, err)
		}
		for _, d := range vms[0].Disks {
			if d.Name == "data" {
				return vms[0], d.WriteBytes
			}
		}
		t.Fatalf("stats: no disk data: %+v", vms[0].Disks)
		return vms[0], 0
	}
	before, wb := disk()
	if out, _, err := sh.Run(ctx, "dd if=/dev/zero of=/dev/vda bs=1M count=8 oflag=direct 2>&1"); err != nil {
		t.Fatalf("dd: %v %s", err, out)
	}
	after, wa := disk()
	if wa-wb < 8<<20 {
		t.Errorf("disk data: %d bytes written by an 8 MiB dd", wa-wb)
	}
	if after.CPU.UsageSeconds <= before.CPU.UsageSeconds || after.Uptime <= before.Uptime || after.CPU.VCPUs != 1 || after.Memory.RSSBytes == 0 {
		t.Errorf("stats did not move: before %+v\nafter %+v", before, after)
	}
}

// floodConsole: the guest prints as fast as it can on its console for 60 s;
// the log stays within keep files of max bytes each, and keeps the end.
func floodConsole(t *testing.T, ctx context.Context, sh *testenv.GuestShell, st supervisor.Status, capBytes int64, keep int) *testenv.GuestShell {
	t.Helper()
	log := st.ConsoleLog
	cmd := "(end=$(($(date +%s)+60)); while [ $(date +%s) -lt $end ]; do i=0; while [ $i -lt 200 ]; do echo VMSUP-FLOOD-LINE-0123456789abcdefghijklmnopqrstuvwxyz; i=$((i+1)); done; done; echo VMSUP-FLOOD-$((1+1))-DONE) >/dev/console 2>&1 </dev/null & true"
	if _, _, err := sh.Run(ctx, cmd); err != nil {
		t.Fatal(err)
	}
	sh.Close() // a console client that does not read would stall the guest's output
	start := time.Now()
	var seen int64
	for time.Since(start) < 90*time.Second {
		var total int64
		for i := range keep + 1 {
			p := log
			if i > 0 {
				p = fmt.Sprintf("%s.%d", log, i)
			}
			fi, err := os.Stat(p)
			if err != nil {
				continue
			}
			if i == keep {
				t.Fatalf("%s: more files than log_files = %d", p, keep)
			}
			if fi.Size() > capBytes {
				t.Fatalf("%s: %d bytes, more than log_size %d", p, fi.Size(), capBytes)
			}
			total += fi.Size()
		}
		seen = max(seen, total)
		if b, _ := os.ReadFile(log); strings.Contains(string(b), "VMSUP-FLOOD-2-DONE") {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "VMSUP-FLOOD-2-DONE") {
		t.Fatalf("the flood's end is not in the log after %s:\n%s", time.Since(start), supervisortest.Tail(string(b), 500))
	}
	t.Logf("a %s console flood: the log held at most %d bytes (cap %d × %d); the logger: %s", time.Since(start).Round(time.Second), seen, keep, capBytes, loggerMemory(t, st.Name))
	sh, err := testenv.DialConsole(ctx, st.Console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	if out, _, err := sh.Run(ctx, "echo alive"); err != nil || !strings.Contains(out, "alive") {
		t.Fatalf("the guest after the flood: %q %v", out, err)
	}
	return sh
}

// loggerMemory is the console logger's resident memory now and at its
// peak, if it still runs (it ends a few seconds after the guest's output).
func loggerMemory(t *testing.T, vm string) string {
	list, err := env.Systemd.Systemctl(context.Background(), "list-units", "--all", "--plain", "--no-legend", companion.LoggerPattern(vm))
	var pids []int
	for _, l := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		if f := strings.Fields(l); err == nil && len(f) > 0 {
			p, _ := env.Systemd.HostPIDs(f[0])
			pids = append(pids, p...)
		}
	}
	if len(pids) != 1 {
		return fmt.Sprintf("%d processes (%v)", len(pids), err)
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pids[0]))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") || strings.HasPrefix(l, "RssAnon:") || strings.HasPrefix(l, "RssFile:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// panicGuest makes the guest's kernel panic (sysrq c); its console client
// goes first, so that it cannot stall the guest's last output.
func panicGuest(t *testing.T, ctx context.Context, sh *testenv.GuestShell) {
	t.Helper()
	if _, _, err := sh.Run(ctx, "(sleep 0.5; echo c > /proc/sysrq-trigger) </dev/null >/dev/null 2>&1 & true"); err != nil {
		t.Fatal(err)
	}
	sh.Close()
}

// waitEvents waits until the VM's history since t0 holds n events of kind.
func waitEvents(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string, t0 time.Time, kind string, n int) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		got = nil
		n1 := 0
		_ = sup.FollowEvents(ctx, []string{name}, t0, false, func(e supervisor.Event) error {
			got = append(got, e.Kind)
			if e.Kind == kind {
				n1++
			}
			return nil
		})
		if n1 >= n {
			return
		}
	}
	t.Fatalf("vm %s: not %d %q events within 2m: %q", name, n, kind, got)
}
