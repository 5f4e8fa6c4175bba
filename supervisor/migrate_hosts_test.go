package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/testenv"
	"github.com/vmsup/vmsup/supervisor"
)

// migHost is one "host" of the cross-host tests: a network namespace made
// inside a systemd sandbox's mount namespace, its own systemd and vmsup
// state root. QEMU needs no network (vmsup relays the stream over TCP):
// the receiver runs in the namespace (the transport enters it) and the
// source dials from it (dial).
type migHost struct {
	name  string
	sd    *testenv.Systemd
	netns string // path from the host: /proc/PID1/root/run/netns/NAME
	ns    string // the namespace's name inside the sandbox
	addr  string // its veth address
	dev   string // its veth
	root  string
	qemu  string
	sup   *supervisor.Supervisor
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
}

// dialIn returns a dialer whose sockets are made in the network namespace
// at nsPath: the dial runs on a locked thread moved into it, and the
// thread is discarded afterwards (its goroutine exits locked).
func dialIn(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			f, err := os.Open(nsPath)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{nil, fmt.Errorf("setns %s: %w", nsPath, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// transport returns the command that runs "vmsup migrate-receive" as this
// host: inside its network namespace, with its root, systemd and QEMU.
// wrap, if set, is put in front of vmsup (fault injection).
func (h *migHost) transport(qemu string, wrap ...string) []string {
	if qemu == "" {
		qemu = h.qemu
	}
	argv := []string{"env", "VMSUP_ROOT=" + h.root, "VMSUP_SYSTEMD_BUS=" + h.sd.BusAddress,
		"VMSUP_JOURNAL_DIR=" + h.sd.JournalDir, "VMSUP_QEMU=" + qemu, "VMSUP_UNIT_DIR=" + h.unitDir(),
		"VMSUP_BOOT_TARGET=" + testenv.BootTarget, "VMSUP_RUN_DIR=" + filepath.Join(h.root, "run"),
		"nsenter", "--net=" + h.netns}
	argv = append(argv, wrap...)
	return append(argv, vmsupBin, "migrate-receive")
}

// unitDir stands for the host's /etc/systemd/system.
func (h *migHost) unitDir() string { return filepath.Join(h.root, "etc-systemd") }

func runCmd(t testing.TB, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// inNS runs argv in the host's network namespace.
func (h *migHost) inNS(t testing.TB, argv ...string) {
	t.Helper()
	runCmd(t, append([]string{"nsenter", "--net=" + h.netns}, argv...)...)
}

// twoHosts makes hosts A (the package's sandbox) and B (a second sandbox),
// each with a network namespace, joined by a veth pair 10.99.N.1 - .2.
func twoHosts(t *testing.T) (a, b *migHost) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	bdir, err := os.MkdirTemp("", "vmsup-mig-b-")
	if err != nil {
		t.Fatal(err)
	}
	sdB, err := testenv.StartSystemd(ctx, bdir)
	if err != nil {
		os.RemoveAll(bdir)
		t.Fatalf("second systemd sandbox (host B): %v", err)
	}
	t.Cleanup(func() { sdB.Stop(); os.RemoveAll(bdir) })
	tag := fmt.Sprintf("%d", os.Getpid()%10000)
	net := fmt.Sprintf("10.99.%d.", os.Getpid()%250+1)
	dir := t.TempDir()
	a = &migHost{name: "A", sd: env.Systemd, ns: "vmsupmigA" + tag, addr: net + "1", dev: "vmA" + tag}
	b = &migHost{name: "B", sd: sdB, ns: "vmsupmigB" + tag, addr: net + "2", dev: "vmB" + tag}
	for _, h := range []*migHost{a, b} {
		runCmd(t, "nsenter", "-t", fmt.Sprint(h.sd.PID1), "-m", "-p", "ip", "netns", "add", h.ns)
		t.Cleanup(func() {
			exec.Command("nsenter", "-t", fmt.Sprint(h.sd.PID1), "-m", "-p", "ip", "netns", "delete", h.ns).Run()
		})
		h.netns = fmt.Sprintf("/proc/%d/root/run/netns/%s", h.sd.PID1, h.ns)
		h.root = filepath.Join(dir, "root"+h.name)
		h.qemu = env.QEMU
		h.dial = dialIn(h.netns)
		h.sup = h.withHook(t, nil)
	}
	// The pair is made in the test's namespace and moved at once.
	runCmd(t, "ip", "link", "add", a.dev, "type", "veth", "peer", "name", b.dev)
	for _, h := range []*migHost{a, b} {
		runCmd(t, "nsenter", "-t", fmt.Sprint(h.sd.PID1), "-m", "-p", "ip", "link", "set", h.dev, "netns", h.ns)
		h.inNS(t, "ip", "link", "set", "lo", "up")
		h.inNS(t, "ip", "addr", "add", h.addr+"/24", "dev", h.dev)
		h.inNS(t, "ip", "link", "set", h.dev, "up")
	}
	return a, b
}

// expectOnlyOn checks that the VM runs on one host and that the other knows
// nothing of it (no state directory, no unit).
func expectOnlyOn(t *testing.T, ctx context.Context, name string, on, off *migHost) {
	t.Helper()
	st, err := on.sup.Status(ctx, name)
	if err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("host %s: want running, got %+v %v", on.name, st, err)
	}
	if _, err := off.sup.Status(ctx, name); !errors.Is(err, supervisor.ErrNotFound) {
		t.Fatalf("host %s: want no such VM, got %v", off.name, err)
	}
	if ls, err := off.sup.List(ctx); err != nil || len(ls) != 0 {
		t.Fatalf("host %s: vmsup ls shows %+v %v", off.name, ls, err)
	}
	if out, _ := off.sd.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+name+"*"); strings.TrimSpace(string(out)) != "" {
		t.Fatalf("host %s: units left: %s", off.name, out)
	}
	for _, d := range []string{"vms", "records"} {
		ents, _ := os.ReadDir(filepath.Join(off.root, d))
		var names []string
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") { // lock files stay beside the VM directories
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			t.Fatalf("host %s: state left in %s: %v", off.name, d, names)
		}
	}
}

// afterDelay runs fn once, d after the step "migrate-prepared".
func afterPrepared(d time.Duration, fn func()) func(vm, step string) {
	return func(vm, step string) {
		if step == "migrate-prepared" {
			go func() { time.Sleep(d); fn() }()
		}
	}
}

// withHook returns a supervisor for host h whose AfterStep is hook.
func (h *migHost) withHook(t *testing.T, hook func(vm, step string)) *supervisor.Supervisor {
	s, err := supervisor.New(supervisor.Options{Root: h.root, SystemdBus: h.sd.BusAddress, JournalDir: h.sd.JournalDir, HostCaps: env.Caps,
		Self: vmsupBin, QEMU: h.qemu, AfterStep: hook, UnitDir: h.unitDir(), BootTarget: testenv.BootTarget,
		RunDir: filepath.Join(h.root, "run")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func killUnit(t *testing.T, sd *testenv.Systemd, unit string) {
	pids, _ := sd.HostPIDs(unit)
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	if len(pids) == 0 {
		t.Errorf("no process in %s to kill", unit)
	}
}

// TestMigrateCrossHost: failures first (each must leave the guest running on
// A only), then a migration A -> B (counter continuous, data intact, status
// agreeing on both hosts), then B -> A with the source QEMU killed mid-way.
func TestMigrateCrossHost(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	a, b := twoHosts(t)
	dir := t.TempDir()
	const name = "mx"
	f := migGuest(t, dir, name, "256M", filepath.Join(dir, "shared-data.raw"))
	if _, err := a.sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.sup.Down(context.Background(), name)
		b.sup.Down(context.Background(), name)
	})
	stA, _ := a.sup.Status(ctx, name)
	waitConsole(t, stA, "VMSUP-SHELL-READY", 90*time.Second)
	writeGuestData(t, ctx, stA.Console, "vmsup-cross-data-7")
	slow := int64(2 << 20) // 2 MiB/s: the stream lasts long enough to break it

	failCase := func(t *testing.T, sup *supervisor.Supervisor, o supervisor.MigrateOptions, want string) {
		t.Helper()
		if sup == nil {
			sup = a.sup
		}
		if o.Address == "" {
			o.Address = b.addr
		}
		if o.Transport == nil {
			o.Transport = b.transport("")
		}
		o.Dial = a.dial
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
		// Where QEMU runs confined (another user, private /tmp), the unit
		// cannot even exec the script: systemd fails the start job.
		want := "simulated start failure"
		if out, _ := exec.Command(vmsupBin, "--help").CombinedOutput(); strings.Contains(string(out), "--qemu-user") {
			want = "start job failed"
		}
		failCase(t, nil, supervisor.MigrateOptions{Transport: b.transport(bad)}, want)
	})
	t.Run("local-only-disk-refused", func(t *testing.T) {
		// B gets its own empty file at the same path: it exists there but is
		// not the source's disk.
		ddir := filepath.Dir(f.VM.Disks[0].File)
		wrap := []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
			fmt.Sprintf("mount -t tmpfs none %s && truncate -s 4M %s && exec \"$@\"", ddir, f.VM.Disks[0].File), "sh"}
		failCase(t, nil, supervisor.MigrateOptions{Transport: b.transport("", wrap...)}, "not on storage shared with the source")
	})
	t.Run("destination-qemu-killed", func(t *testing.T) {
		sup := a.withHook(t, afterPrepared(1500*time.Millisecond, func() { killUnit(t, b.sd, "vmsup-"+name+".service") }))
		failCase(t, sup, supervisor.MigrateOptions{Bandwidth: slow}, "migration failed")
	})
	t.Run("network-down", func(t *testing.T) {
		sup := a.withHook(t, afterPrepared(1500*time.Millisecond, func() {
			exec.Command("nsenter", "--net="+a.netns, "ip", "link", "set", a.dev, "down").Run()
		}))
		defer a.inNS(t, "ip", "link", "set", a.dev, "up")
		failCase(t, sup, supervisor.MigrateOptions{Bandwidth: slow, StallTimeout: 3 * time.Second}, "no progress for 3s")
	})
	t.Run("cancel", func(t *testing.T) {
		sup := a.withHook(t, afterPrepared(1500*time.Millisecond, func() {
			if err := a.sup.CancelMigration(context.Background(), name); err != nil {
				t.Errorf("cancel: %v", err)
			}
		}))
		failCase(t, sup, supervisor.MigrateOptions{Bandwidth: slow}, "migration cancelled")
	})
	t.Run("ctrl-c", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		sup := a.withHook(t, afterPrepared(1500*time.Millisecond, cancel))
		o := supervisor.MigrateOptions{To: "B", Address: b.addr, Transport: b.transport(""), Bandwidth: slow, Dial: a.dial}
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
		cmd := exec.Command("nsenter", "--net="+a.netns, vmsupBin, "migrate", name, "--to", "B", "--address", b.addr,
			"--transport", strings.Join(b.transport(""), " "), "--bandwidth", "2M")
		cmd.Env = append(os.Environ(), "VMSUP_ROOT="+a.root, "VMSUP_SYSTEMD_BUS="+a.sd.BusAddress, "VMSUP_QEMU="+a.qemu)
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
			out, _ := b.sd.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+name+"*")
			_, serr := b.sup.Status(ctx, name)
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
		if _, err := a.sup.Enable(ctx, f); err != nil {
			t.Fatal(err)
		}
		n := lastCounter(t, stA.ConsoleLog)
		var reports int
		res, err := a.sup.Migrate(ctx, name, supervisor.MigrateOptions{To: "B", Address: b.addr, Transport: b.transport(""), Dial: a.dial,
			Progress: func(supervisor.MigrationProgress) { reports++ }, ProgressInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("A -> B: %+v (%d progress reports)", res, reports)
		expectOnlyOn(t, ctx, name, b, a)
		stB, _ := b.sup.Status(ctx, name)
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
		if ur, err := b.sup.Up(ctx, f); err != nil || ur[0].Action != supervisor.Unchanged {
			t.Fatalf("up on B after migration: %+v %v", ur, err)
		}
		if en, _ := a.sup.Enabled(); len(en) != 0 {
			t.Fatalf("A still enabled for boot after the VM left: %v", en)
		}
		if _, err := os.Stat(filepath.Join(a.unitDir(), supervisor.BootUnitName)); !os.IsNotExist(err) {
			t.Fatalf("A's boot unit left: %v", err)
		}
		if en, _ := b.sup.Enabled(); en[name] != filepath.Join(b.root, "records", name, "spec.toml") {
			t.Fatalf("B not enabled for boot from the applied spec: %v", en)
		}
		// B's boot brings it up from that spec (it runs: unchanged).
		if ar, err := b.sup.Autostart(ctx); err != nil || len(ar) != 1 || ar[0].Action != supervisor.Unchanged {
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
		sup := b.withHook(t, afterPrepared(1500*time.Millisecond, func() { killUnit(t, b.sd, "vmsup-"+name+".service") }))
		_, err := sup.Migrate(ctx, name, supervisor.MigrateOptions{To: "A", Address: a.addr, Transport: a.transport(""), Bandwidth: slow, Dial: b.dial})
		if err == nil {
			t.Fatal("migration succeeded with its source killed")
		}
		t.Logf("as wanted: %v", err)
		waitState(t, ctx, b.sup, name, supervisor.StateCrashed, 30*time.Second)
		if _, err := a.sup.Status(ctx, name); !errors.Is(err, supervisor.ErrNotFound) {
			t.Fatalf("A: want no such VM, got %v", err)
		}
		if out, _ := a.sd.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+name+"*"); strings.TrimSpace(string(out)) != "" {
			t.Fatalf("A: units left: %s", out)
		}
	})
}
