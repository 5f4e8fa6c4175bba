package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// The cross-host helpers (supervisortest), under the names these tests use.
func twoHosts(t *testing.T) (a, b *supervisortest.Host) {
	t.Helper()
	return supervisortest.TwoHosts(t, env, vmsupBin)
}

func runCmd(t testing.TB, argv ...string) {
	t.Helper()
	supervisortest.RunCmd(t, argv...)
}

func expectOnlyOn(t *testing.T, ctx context.Context, name string, on, off *supervisortest.Host) {
	t.Helper()
	supervisortest.ExpectOnlyOn(t, ctx, name, on, off)
}

func afterPrepared(d time.Duration, fn func()) func(vm, step string) {
	return supervisortest.AfterPrepared(d, fn)
}

func killUnit(t *testing.T, sd *testenv.Systemd, unit string) { supervisortest.KillUnit(t, sd, unit) }

// TestMigrateCrossHost: failures first (each must leave the guest running on
// A only), then a migration A -> B (counter continuous, data intact, status
// agreeing on both hosts), then B -> A with the source QEMU killed mid-way.
func TestMigrateCrossHost(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	a, b := twoHosts(t)
	dir := t.TempDir()
	const name = "mx"
	f := migGuest(t, dir, name, "256M", filepath.Join(dir, "shared-data.raw"))
	if _, err := a.Sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Sup.Down(context.Background(), name)
		b.Sup.Down(context.Background(), name)
	})
	stA, _ := a.Sup.Status(ctx, name)
	waitConsole(t, stA, "VMSUP-SHELL-READY", 90*time.Second)
	writeGuestData(t, ctx, stA.Console, "vmsup-cross-data-7")
	slow := int64(2 << 20) // 2 MiB/s: the stream lasts long enough to break it

	failCase := func(t *testing.T, sup *supervisor.Supervisor, o supervisor.MigrateOptions, want string) {
		t.Helper()
		if sup == nil {
			sup = a.Sup
		}
		if o.Address == "" {
			o.Address = b.Addr
		}
		if o.Transport == nil {
			o.Transport = b.Transport("")
		}
		o.Dial = a.Dial
		o.To = "B"
		n := lastCounter(t, stA.ConsoleLog)
		t0 := time.Now()
		_, err := sup.Migrate(ctx, name, o)
		if err == nil {
			t.Fatal("migration succeeded, want a failure")
		}
		t.Logf("failed after %s as wanted: %v", time.Since(t0).Round(time.Millisecond), err)
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not contain %q", err, want)
		}
		var me *supervisor.MigrateError
		if errors.As(err, &me) && me.Running != "source" {
			t.Fatalf("error says the guest runs on %q", me.Running)
		}
		expectOnlyOn(t, ctx, name, a, b)
		checkContinuous(t, waitCounterPast(t, stA.ConsoleLog, n+3, 30*time.Second))
	}

	t.Run("destination-cannot-start", func(t *testing.T) {
		bad := filepath.Join(dir, "qemu-broken")
		os.WriteFile(bad, []byte("#!/bin/sh\necho 'qemu-system-x86_64: simulated start failure' >&2\nexit 1\n"), 0o755)
		// The destination probes its QEMU (as itself) to resolve the
		// source's machine type before any unit starts: the refusal is
		// the probe's, with QEMU's last line.
		failCase(t, nil, supervisor.MigrateOptions{Transport: b.Transport(bad)}, "probe "+bad+": start "+bad+": qemu-system-x86_64: simulated start failure")
	})
	t.Run("local-only-disk-refused", func(t *testing.T) {
		// B gets its own empty file at the same path: it exists there but is
		// not the source's disk.
		ddir := filepath.Dir(f.VM.Disks[0].File)
		wrap := []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
			fmt.Sprintf("mount -t tmpfs none %s && truncate -s 4M %s && exec \"$@\"", ddir, f.VM.Disks[0].File), "sh"}
		failCase(t, nil, supervisor.MigrateOptions{Transport: b.Transport("", wrap...)}, "exists on this host but is not the source's")
	})
	t.Run("destination-qemu-killed", func(t *testing.T) {
		sup := a.WithHook(t, afterPrepared(1500*time.Millisecond, func() { killUnit(t, b.SD, "vmsup-"+name+".service") }))
		failCase(t, sup, supervisor.MigrateOptions{Bandwidth: slow}, "migration failed")
	})
	t.Run("network-down", func(t *testing.T) {
		sup := a.WithHook(t, afterPrepared(1500*time.Millisecond, func() {
			exec.Command("nsenter", "--net="+a.Netns, "ip", "link", "set", a.Dev, "down").Run()
		}))
		defer a.InNS(t, "ip", "link", "set", a.Dev, "up")
		failCase(t, sup, supervisor.MigrateOptions{Bandwidth: slow, StallTimeout: 3 * time.Second}, "no progress for 3s")
	})
	t.Run("cancel", func(t *testing.T) {
		sup := a.WithHook(t, afterPrepared(1500*time.Millisecond, func() {
			if err := a.Sup.CancelMigration(context.Background(), name); err != nil {
				t.Errorf("cancel: %v", err)
			}
		}))
		failCase(t, sup, supervisor.MigrateOptions{Bandwidth: slow}, "migration cancelled")
	})
	t.Run("ctrl-c", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		sup := a.WithHook(t, afterPrepared(1500*time.Millisecond, cancel))
		o := supervisor.MigrateOptions{To: "B", Address: b.Addr, Transport: b.Transport(""), Bandwidth: slow, Dial: a.Dial}
		_, err := sup.Migrate(cctx, name, o)
		if !errors.Is(err, supervisor.ErrMigrationCancelled) {
			t.Fatalf("want cancelled, got %v", err)
		}
		expectOnlyOn(t, ctx, name, a, b)
	})
	t.Run("no-convergence", func(t *testing.T) {
		// A guest that keeps dirtying memory, a tiny bandwidth, a short timeout.
		guestExec(t, ctx, stA.Console, "(while :; do dd if=/dev/urandom of=/dirty bs=1M count=16 2>/dev/null; done) >/dev/null 2>&1 & echo $! >/dirty.pid")
		defer guestExec(t, ctx, stA.Console, "kill $(cat /dirty.pid); rm -f /dirty")
		failCase(t, nil, supervisor.MigrateOptions{Bandwidth: 1 << 20, Timeout: 8 * time.Second}, "did not converge within 8s")
	})
	t.Run("source-vmsup-killed", func(t *testing.T) {
		// The CLI on A is killed mid-stream: B's receiver sees its stdin
		// close and tears down; A's QEMU sees the stream break and runs on.
		// Run in A's namespace: the CLI dials B's relay from there.
		cmd := exec.Command("nsenter", "--net="+a.Netns, vmsupBin, "migrate", name, "--to", "B", "--address", b.Addr,
			"--transport", strings.Join(b.Transport(""), " "), "--bandwidth", "2M")
		cmd.Env = append(os.Environ(), "VMSUP_ROOT="+a.Root, "VMSUP_SYSTEMD_BUS="+a.SD.BusAddress, "VMSUP_QEMU="+a.QEMU)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		var got strings.Builder
		for !strings.Contains(got.String(), "active") {
			n, err := out.Read(buf)
			if err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("vmsup migrate ended before streaming: %v; output %q", err, got.String())
			}
			got.Write(buf[:n])
		}
		t.Logf("progress line: %q", strings.SplitN(got.String(), "\n", 2)[0])
		cmd.Process.Kill()
		cmd.Wait()
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, _ := b.SD.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+name+"*")
			_, serr := b.Sup.Status(ctx, name)
			if strings.TrimSpace(string(out)) == "" && errors.Is(serr, supervisor.ErrNotFound) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("B not torn down after the source vmsup died: units %q, status err %v", out, serr)
			}
			time.Sleep(200 * time.Millisecond)
		}
		n := lastCounter(t, stA.ConsoleLog)
		expectOnlyOn(t, ctx, name, a, b)
		checkContinuous(t, waitCounterPast(t, stA.ConsoleLog, n+3, 30*time.Second))
	})
	if t.Failed() {
		return
	}

	t.Run("success", func(t *testing.T) {
		// Enabled for boot on A: the mark moves with the VM, so a reboot of
		// A can never start a second copy.
		if _, err := a.Sup.Enable(ctx, f); err != nil {
			t.Fatal(err)
		}
		n := lastCounter(t, stA.ConsoleLog)
		var reports int
		res, err := a.Sup.Migrate(ctx, name, supervisor.MigrateOptions{To: "B", Address: b.Addr, Transport: b.Transport(""), Dial: a.Dial,
			Progress: func(supervisor.MigrationProgress) { reports++ }, ProgressInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("A -> B: %+v (%d progress reports)", res, reports)
		expectOnlyOn(t, ctx, name, b, a)
		stB, _ := b.Sup.Status(ctx, name)
		if stB.Unit != "vmsup-"+name+".service" || stB.MainPID == 0 {
			t.Fatalf("status on B: %+v", stB)
		}
		c := waitCounterPast(t, stB.ConsoleLog, n+10, 30*time.Second)
		checkContinuous(t, c)
		if c[0] != 0 {
			t.Fatalf("B's console log does not start with the guest's history: first counter %d", c[0])
		}
		if got := readGuestData(t, ctx, stB.Console, 18); got != "vmsup-cross-data-7" {
			t.Fatalf("data on B: %q", got)
		}
		// B now owns the VM: up with the same file leaves it alone.
		if ur, err := b.Sup.Up(ctx, f); err != nil || ur[0].Action != supervisor.Unchanged {
			t.Fatalf("up on B after migration: %+v %v", ur, err)
		}
		if en, _ := a.Sup.Enabled(); len(en) != 0 {
			t.Fatalf("A still enabled for boot after the VM left: %v", en)
		}
		if _, err := os.Stat(filepath.Join(a.UnitDir(), supervisor.BootUnitName)); !os.IsNotExist(err) {
			t.Fatalf("A's boot unit left: %v", err)
		}
		if en, _ := b.Sup.Enabled(); en[name] != filepath.Join(b.Root, "records", name, "spec.toml") {
			t.Fatalf("B not enabled for boot from the applied spec: %v", en)
		}
		// B's boot brings it up from that spec (it runs: unchanged).
		if ar, err := b.Sup.Autostart(ctx); err != nil || len(ar) != 1 || ar[0].Action != supervisor.Unchanged {
			t.Fatalf("autostart on B: %+v %v", ar, err)
		}
	})
	if t.Failed() {
		return
	}
	t.Run("source-killed", func(t *testing.T) {
		// Back from B to A, and B's QEMU dies mid-stream: the guest is lost
		// with it (its memory was never complete on A); A must not run a
		// half-migrated guest: it tears its QEMU down and knows nothing.
		sup := b.WithHook(t, afterPrepared(1500*time.Millisecond, func() { killUnit(t, b.SD, "vmsup-"+name+".service") }))
		_, err := sup.Migrate(ctx, name, supervisor.MigrateOptions{To: "A", Address: a.Addr, Transport: a.Transport(""), Bandwidth: slow, Dial: b.Dial})
		if err == nil {
			t.Fatal("migration succeeded with its source killed")
		}
		t.Logf("as wanted: %v", err)
		waitState(t, ctx, b.Sup, name, supervisor.StateCrashed, 30*time.Second)
		if _, err := a.Sup.Status(ctx, name); !errors.Is(err, supervisor.ErrNotFound) {
			t.Fatalf("A: want no such VM, got %v", err)
		}
		if out, _ := a.SD.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+name+"*"); strings.TrimSpace(string(out)) != "" {
			t.Fatalf("A: units left: %s", out)
		}
	})
}
