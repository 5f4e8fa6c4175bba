package units_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/units"
)

var sandbox *testenv.Systemd

func TestMain(m *testing.M) {
	if out := os.Getenv(fifoReaderEnv); out != "" {
		fifoReader(out) // started by TestFIFOSocket's socket
	}
	if os.Geteuid() != 0 {
		fmt.Println("units tests need root (systemd sandbox); skipping all")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "vmsup-units-")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sandbox, err = testenv.StartSystemd(ctx, dir)
	if err != nil {
		fmt.Println("systemd sandbox:", err)
		return 1
	}
	defer sandbox.Stop()
	return m.Run()
}

func connect(t *testing.T) (*units.Manager, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	m, err := units.Connect(ctx, sandbox.BusAddress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, ctx
}

func waitState(t *testing.T, m *units.Manager, ctx context.Context, name, state string) units.Status {
	t.Helper()
	var st units.Status
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var err error
		if st, err = m.Status(ctx, name); err != nil {
			t.Fatal(err)
		}
		if st.ActiveState == state || (state == "gone" && (!st.Exists || st.ActiveState == "inactive")) {
			return st
		}
	}
	t.Fatalf("unit %s never %s: %+v", name, state, st)
	return st
}

func readCgroup(t *testing.T, hier, unit, file string) string {
	t.Helper()
	dir, err := sandbox.CgroupDir(hier, unit)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestLimits: the spec's cgroup limits and device policy reach the kernel.
func TestLimits(t *testing.T) {
	m, ctx := connect(t)
	// Any character device this host has will do (not every host has
	// /dev/kvm).
	dev, rule := "", ""
	for _, d := range []string{"/dev/kvm", "/dev/net/tun", "/dev/fuse"} {
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
			dev, rule = d, fmt.Sprintf("c %d:%d rw", unix.Major(st.Rdev), unix.Minor(st.Rdev))
			break
		}
	}
	if dev == "" {
		t.Fatal("none of /dev/kvm, /dev/net/tun, /dev/fuse is a character device here")
	}
	u := units.Unit{
		Name: "vmsup-limits.service", Slice: "vmsup.slice", Argv: []string{"/bin/sleep", "300"},
		MemoryMax: 64 << 20, TasksMax: 32, CPUQuota: 50, CPUWeight: 200, UMask: 0o077,
		DeviceAllow: []units.DeviceRule{{Path: dev, Access: "rw"}},
	}
	if err := m.Start(ctx, u); err != nil {
		t.Fatal(err)
	}
	defer m.Stop(ctx, u.Name)
	st := waitState(t, m, ctx, u.Name, "active")
	if !strings.Contains(st.ControlGroup, "vmsup.slice/vmsup-limits.service") {
		t.Errorf("cgroup %q not in vmsup.slice", st.ControlGroup)
	}
	for _, c := range []struct{ hier, file, want string }{
		{"memory", "memory.limit_in_bytes", "67108864"},
		{"pids", "pids.max", "32"},
		{"cpu", "cpu.cfs_quota_us", "50000"},
	} {
		if got := readCgroup(t, c.hier, u.Name, c.file); got != c.want {
			t.Errorf("%s/%s = %s, want %s", c.hier, c.file, got, c.want)
		}
	}
	devs := readCgroup(t, "devices", u.Name, "devices.list")
	if !strings.Contains(devs, rule) || strings.Contains(devs, "a *:* rwm") {
		t.Errorf("DevicePolicy=closed + %s (%s) not applied: %q", dev, rule, devs)
	}
	if err := m.Stop(ctx, u.Name); err != nil {
		t.Fatal(err)
	}
	waitState(t, m, ctx, u.Name, "gone")
}

// TestFailureNotIgnored: a main process that fails makes the unit fail, and
// the reason is kept until reset.
func TestFailureNotIgnored(t *testing.T) {
	m, ctx := connect(t)
	for _, c := range []struct {
		name string
		argv []string
		kill bool
		want string
	}{
		{"vmsup-exit3.service", []string{"/bin/sh", "-c", "exit 3"}, false, "exited with status 3"},
		{"vmsup-killed.service", []string{"/bin/sleep", "300"}, true, "killed by signal KILL"},
	} {
		// A process that fails at once may fail the start job itself (it
		// can exit before systemd finishes the job); either way the unit
		// must end failed with the reason.
		if err := m.Start(ctx, units.Unit{Name: c.name, Argv: c.argv}); err != nil && c.kill {
			t.Fatal(err)
		}
		if c.kill {
			waitState(t, m, ctx, c.name, "active")
			if err := m.Kill(ctx, c.name, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		st := waitState(t, m, ctx, c.name, "failed")
		if !st.Crashed() || st.ExitReason() != c.want {
			t.Errorf("%s: crashed %v reason %q, want %q", c.name, st.Crashed(), st.ExitReason(), c.want)
		}
		if err := m.ResetFailed(ctx, c.name); err != nil {
			t.Fatal(err)
		}
		waitState(t, m, ctx, c.name, "gone")
	}
}

// TestExecStop: Stop runs ExecStop= with $MAINPID while the process lives.
func TestExecStop(t *testing.T) {
	m, ctx := connect(t)
	out := filepath.Join(t.TempDir(), "stopped")
	u := units.Unit{
		Name: "vmsup-stop.service", Argv: []string{"/bin/sleep", "300"}, TimeoutStop: 5 * time.Second,
		ExecStop: [][]string{{"/bin/sh", "-c", "echo stop-hook $MAINPID > " + out}},
	}
	if err := m.Start(ctx, u); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, m, ctx, u.Name, "active")
	if err := m.Stop(ctx, u.Name); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil || strings.TrimSpace(string(b)) != fmt.Sprintf("stop-hook %d", st.MainPID) {
		t.Fatalf("ExecStop output %q %v, want MAINPID %d", b, err, st.MainPID)
	}
}

func TestConnectNoSystemd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := units.Connect(ctx, "unix:path=/nonexistent/bus")
	if !errors.Is(err, units.ErrNoSystemd) || !strings.Contains(err.Error(), "unix:path=/nonexistent/bus") {
		t.Fatalf("err = %v", err)
	}
}

func TestBadUnit(t *testing.T) {
	m, ctx := connect(t)
	if err := m.Start(ctx, units.Unit{Name: "x.scope", Argv: []string{"/bin/true"}}); err == nil {
		t.Fatal("non-service name accepted")
	}
	if err := m.Start(ctx, units.Unit{Name: "x.service"}); err == nil {
		t.Fatal("empty argv accepted")
	}
}

// TestAfter: a unit ordered After= another stops first when both stop in
// one transaction (host shutdown): the VM before the network it needs.
func TestAfter(t *testing.T) {
	m, ctx := connect(t)
	log := filepath.Join(t.TempDir(), "order")
	dep := units.Unit{Name: "vmsup-dep.service", Argv: []string{"/bin/sleep", "300"},
		ExecStop: [][]string{{"/bin/sh", "-c", "echo dep >> " + log}}}
	vm := units.Unit{Name: "vmsup-after.service", Argv: []string{"/bin/sleep", "300"}, After: []string{dep.Name},
		// No ";" in the command: systemd's transient file keeps it as "\;",
		// which the daemon-reload below would hand the shell literally.
		ExecStop: [][]string{{"/bin/sh", "-c", "sleep 0.3 && echo vm >> " + log}}}
	for _, u := range []units.Unit{dep, vm} {
		if err := m.Start(ctx, u); err != nil {
			t.Fatal(err)
		}
		waitState(t, m, ctx, u.Name, "active")
	}
	// Like shutdown.target: one target conflicting with both stops them in
	// one transaction, where ordering applies.
	target := filepath.Join(sandbox.RunDir, "systemd", "transient", "vmsup-stopboth.target")
	if err := os.WriteFile(target, []byte("[Unit]\nConflicts="+dep.Name+" "+vm.Name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(target)
	if out, err := sandbox.Systemctl(ctx, "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	if out, err := sandbox.Systemctl(ctx, "start", "vmsup-stopboth.target"); err != nil {
		t.Fatalf("stop both: %v %s", err, out)
	}
	for _, u := range []units.Unit{dep, vm} {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			st, err := m.Status(ctx, u.Name)
			if err != nil || !st.Exists || st.ActiveState == "inactive" || st.ActiveState == "failed" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still %s", u.Name, st.ActiveState)
			}
		}
		_ = m.ResetFailed(ctx, u.Name)
	}
	if b, _ := os.ReadFile(log); string(b) != "vm\ndep\n" {
		t.Fatalf("stop order %q, want the After= unit first", b)
	}
}

// TestWhileMainRuns: a wrapped ExecStop= runs its command, with its
// arguments, on a stop while the main process lives, and not after the
// main process ended by itself.
func TestWhileMainRuns(t *testing.T) {
	m, ctx := connect(t)
	dir := t.TempDir()
	for _, c := range []struct {
		name, main string
		stop       bool
		want       string
	}{
		{"vmsup-guard-live.service", "300", true, "ran a b"},
		{"vmsup-guard-ended.service", "0.2", false, ""},
	} {
		out := filepath.Join(dir, c.name)
		u := units.Unit{
			Name: c.name, Argv: []string{"/bin/sleep", c.main}, TimeoutStop: 5 * time.Second,
			ExecStop: [][]string{units.WhileMainRuns([]string{"/bin/sh", "-c", "echo ran a b > " + out})},
		}
		if err := m.Start(ctx, u); err != nil {
			t.Fatal(err)
		}
		if c.stop {
			waitState(t, m, ctx, u.Name, "active")
			if err := m.Stop(ctx, u.Name); err != nil {
				t.Fatal(err)
			}
		} else {
			waitState(t, m, ctx, u.Name, "gone")
		}
		b, _ := os.ReadFile(out)
		if got := strings.TrimSpace(string(b)); got != c.want {
			t.Errorf("%s: ExecStop wrote %q, want %q", c.name, got, c.want)
		}
	}
}

// TestWhileMainRunsUnguarded: an argv the transient file could not carry
// through a daemon-reload is left as it is.
func TestWhileMainRunsUnguarded(t *testing.T) {
	for _, argv := range [][]string{{"/bin/sh", "-c", `echo "$MAINPID"`}, {"/bin/x", "a;b"}, {"/bin/x", "it's"}, {"/bin/x", ""}} {
		if got := units.WhileMainRuns(argv); !slices.Equal(got, argv) {
			t.Errorf("%q wrapped as %q", argv, got)
		}
	}
}
