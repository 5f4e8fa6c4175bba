package units_test

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/units"
)

// MaxExposure is the highest systemd-analyze security figure a VM unit with
// a user-mode NIC may have (measured 1.1 with systemd 252; the checks left
// open are Internet sockets, the host network, the host's root directory and
// ProtectClock's rtc read access). A change that raises it fails here.
const MaxExposure = 1.1

func analyzeCmd() []string {
	return []string{"nsenter", "-t", strconv.Itoa(sandbox.PID1), "-m", "-p", "systemd-analyze"}
}

// TestSandboxExposure measures systemd-analyze security for the unit shape
// vmsup used before confinement (root, DevicePolicy=closed, UMask=0077) and
// for the sandboxed one, with and without host networking.
func TestSandboxExposure(t *testing.T) {
	m, ctx := connect(t)
	before := units.Unit{Name: "vmsup-before.service", Argv: []string{"/bin/sleep", "300"}, UMask: 0o077}
	dir := t.TempDir()
	after := func(name string, hostNet bool) units.Unit {
		return units.Unit{Name: name, Argv: []string{"/bin/sleep", "300"}, UMask: 0o077,
			Sandbox: &units.Sandbox{User: "daemon", Group: "daemon", HostNetwork: hostNet,
				ReadWritePaths: []string{dir}, BindPaths: []string{dir}}}
	}
	for _, c := range []struct {
		u   units.Unit
		max float64
	}{
		{before, 10},
		{after("vmsup-after.service", true), MaxExposure},
		{after("vmsup-after-nonet.service", false), MaxExposure},
	} {
		if err := m.Start(ctx, c.u); err != nil {
			t.Fatalf("%s: %v", c.u.Name, err)
		}
		waitState(t, m, ctx, c.u.Name, "active")
		e, err := units.AnalyzeSecurity(ctx, analyzeCmd(), "", c.u.Name)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: exposure %.1f %s; open: %v", c.u.Name, e.Level, e.Rating, e.Open)
		if e.Level > c.max {
			t.Errorf("%s: exposure %.1f is above %.1f", c.u.Name, e.Level, c.max)
		}
		if err := m.Stop(ctx, c.u.Name); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSandboxRefusesRoot: a sandbox never runs as root.
func TestSandboxRefusesRoot(t *testing.T) {
	m, ctx := connect(t)
	for _, u := range []string{"", "root", "0"} {
		err := m.Start(ctx, units.Unit{Name: "vmsup-root.service", Argv: []string{"/bin/true"}, Sandbox: &units.Sandbox{User: u}})
		if err == nil {
			t.Errorf("sandbox with User %q started", u)
		}
	}
}

// TestStopPostPrivileged: a sandboxed service's stop hooks run as root
// with StopHooksPrivileged (clean-up of ACLs, profiles and taps; vmsup's
// stop hook, spared the sandbox set-up), else inside the sandbox.
func TestStopPostPrivileged(t *testing.T) {
	m, ctx := connect(t)
	for _, priv := range []bool{false, true} {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		u := units.Unit{Name: "vmsup-stoppost.service", Argv: []string{"/bin/sleep", "300"},
			ExecStop:            [][]string{{"/bin/sh", "-c", "id -u > " + dir + "/stop"}},
			ExecStopPost:        [][]string{{"/bin/sh", "-c", "id -u > " + dir + "/post"}},
			StopHooksPrivileged: priv,
			Sandbox:             &units.Sandbox{User: "daemon", ReadWritePaths: []string{dir}, BindPaths: []string{dir}}}
		if err := m.Start(ctx, u); err != nil {
			t.Fatal(err)
		}
		waitState(t, m, ctx, u.Name, "active")
		if err := m.Stop(ctx, u.Name); err != nil {
			t.Fatal(err)
		}
		want := "1" // daemon
		if priv {
			want = "0"
		}
		for _, f := range []string{"stop", "post"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil || strings.TrimSpace(string(b)) != want {
				t.Errorf("StopHooksPrivileged %v: %s ran as uid %q (%v), want %s", priv, f, b, err, want)
			}
		}
	}
}

// TestWriteExecuteTCG measures what MemoryDenyWriteExecute= does to QEMU's
// TCG: its default JIT buffer is mapped writable and executable and QEMU
// exits ("mprotect of jit buffer: Operation not permitted"); with
// split-wx=on (two mappings of one memfd, never W+X) it runs, so vmsup keeps
// MemoryDenyWriteExecute=yes and renders split-wx=on.
func TestWriteExecuteTCG(t *testing.T) {
	if _, err := os.Stat("/usr/bin/qemu-system-x86_64"); err != nil {
		t.Fatal("QEMU missing: install qemu-system-x86 (scripts/install-deps.sh)")
	}
	m, ctx := connect(t)
	for _, c := range []struct {
		accel string
		runs  bool
	}{{"tcg", false}, {"tcg,split-wx=on", true}} {
		name := "vmsup-mdwe-" + strings.NewReplacer(",", "-", "=", "-").Replace(c.accel) + ".service"
		u := units.Unit{Name: name, Argv: []string{"/usr/bin/qemu-system-x86_64", "-nodefaults", "-no-user-config",
			"-display", "none", "-machine", "q35", "-accel", c.accel, "-m", "64", "-S"},
			Sandbox: &units.Sandbox{User: "daemon", HostNetwork: false}}
		if err := m.Start(ctx, u); err != nil {
			t.Fatal(err)
		}
		// TCG sets up its buffer before QEMU would wait for a monitor.
		time.Sleep(1500 * time.Millisecond)
		st, err := m.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		running := st.ActiveState == "active"
		journal, _ := sandbox.Journal(ctx, name)
		t.Logf("-accel %s under MemoryDenyWriteExecute=yes: %s %s", c.accel, st.ActiveState, lastQEMULine(journal))
		if running != c.runs {
			t.Errorf("-accel %s: unit %s, want running=%v; journal:\n%s", c.accel, st.ActiveState, c.runs, journal)
		}
		_ = m.Stop(ctx, name)
		_ = m.ResetFailed(ctx, name)
	}
}

func lastQEMULine(j string) string {
	var last string
	for _, l := range strings.Split(j, "\n") {
		if strings.Contains(l, "qemu-system") {
			last = l
		}
	}
	return last
}

// TestAddDevice: a running sandboxed unit gets a device node it was not
// started with (as a hot-plugged host device's /dev/vfio group node): its
// private /dev lacks it and its device policy refuses it; after AddDevice it
// opens it; after RemoveDevice the node is gone from its /dev. The node is
// the test's own (fuse's numbers, 0600), in a directory of its own under
// /dev (DeviceAllow= takes only /dev paths).
func TestAddDevice(t *testing.T) {
	devDir, err := os.MkdirTemp("/dev", "vmsup-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(devDir)
	node := filepath.Join(devDir, "fuse")
	if err := syscall.Mknod(node, syscall.S_IFCHR|0o600, int(unix.Mkdev(10, 229))); err != nil {
		t.Skipf("mknod %s: %v", node, err)
	}
	m, ctx := connect(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	script := `: >` + dir + `/started; until (exec 3<>` + node + `) 2>` + dir + `/err; do sleep 0.05; done; : >` + dir +
		`/opened; while [ -e ` + node + ` ]; do sleep 0.05; done; : >` + dir + `/gone; exec sleep 300`
	u := units.Unit{Name: "vmsup-adddev.service", Argv: []string{"/bin/sh", "-c", script},
		Sandbox: &units.Sandbox{User: "daemon", ReadWritePaths: []string{dir}, BindPaths: []string{dir}}}
	if err := m.Start(ctx, u); err != nil {
		t.Fatal(err)
	}
	defer m.Stop(ctx, u.Name)
	waitFile := func(f string, d time.Duration) bool {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
				return true
			}
		}
		return false
	}
	if !waitFile("started", 10*time.Second) {
		t.Fatal("the unit did not start")
	}
	if waitFile("opened", time.Second) {
		t.Fatalf("the unit opened %s before it was given it", node)
	}
	pids, err := sandbox.HostPIDs(u.Name)
	if err != nil || len(pids) == 0 {
		t.Fatalf("the unit's pid: %v %v", pids, err)
	}
	daemon, err := user.Lookup("daemon")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(daemon.Uid)
	if err := m.AddDevice(ctx, u.Name, pids[0], node, uid); err != nil {
		t.Fatal(err)
	}
	if !waitFile("opened", 10*time.Second) {
		e, _ := os.ReadFile(filepath.Join(dir, "err"))
		t.Fatalf("the unit did not open %s after AddDevice: %s", node, e)
	}
	if err := units.RemoveDevice(ctx, pids[0], node); err != nil {
		t.Fatal(err)
	}
	if !waitFile("gone", 10*time.Second) {
		t.Errorf("%s still in the unit's /dev after RemoveDevice", node)
	}
	if _, err := os.Stat(node); err != nil {
		t.Errorf("RemoveDevice removed the host's node: %v", err)
	}
}
