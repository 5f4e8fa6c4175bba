package supervisortest

import (
	"context"
	"encoding/json"
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

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
)

// Host is one "host" of the cross-host tests: a network namespace made
// inside a systemd sandbox's mount namespace, its own systemd and vmsup
// state root. QEMU needs no network (vmsup relays the stream over TCP):
// the receiver runs in the namespace (Transport enters it) and the source
// dials from it (Dial).
type Host struct {
	Name  string
	SD    *testenv.Systemd
	Netns string // path from the host: /proc/PID1/root/run/netns/NAME
	NS    string // the namespace's name inside the sandbox
	Addr  string // its veth address
	Dev   string // its veth
	Root  string
	QEMU  string
	Sup   *supervisor.Supervisor
	Dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	// Caps is the host probe's record every supervisor of the host uses:
	// the Env's, or QEMU 10's after PutQEMU10.
	Caps *supervisor.HostCaps

	env   *testenv.Env // the host places
	self  string       // the vmsup binary: units call it, Transport runs it
	enter []string     // put before vmsup in Transport: into the host's mount namespace
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

// Transport returns the command that runs "vmsup migrate-receive" as this
// host: inside its network namespace, with its root, systemd and QEMU (qemu
// instead, if set). wrap, if set, is put in front of vmsup (fault
// injection).
func (h *Host) Transport(qemu string, wrap ...string) []string {
	if qemu == "" {
		qemu = h.QEMU
	}
	argv := []string{"env", "VMSUP_ROOT=" + h.Root, "VMSUP_SYSTEMD_BUS=" + h.SD.BusAddress,
		"VMSUP_JOURNAL_DIR=" + h.SD.JournalDir, "VMSUP_QEMU=" + qemu, "VMSUP_UNIT_DIR=" + h.UnitDir(),
		"VMSUP_BOOT_TARGET=" + testenv.BootTarget, "VMSUP_RUN_DIR=" + filepath.Join(h.Root, "run"),
		"VMSUP_ALLOW_PATHS=" + strings.Join(h.env.AllowPaths, ":"), "VMSUP_BLOCK_DIRS=" + strings.Join(h.env.BlockDirs, ":"),
		"nsenter", "--net=" + h.Netns}
	argv = append(append(argv, h.enter...), wrap...)
	return append(argv, h.self, "migrate-receive")
}

// UnitDir stands for the host's /etc/systemd/system.
func (h *Host) UnitDir() string { return filepath.Join(h.Root, "etc-systemd") }

// RunCmd runs argv and fails the test, with its output, if it fails.
func RunCmd(t testing.TB, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// InNS runs argv in the host's network namespace.
func (h *Host) InNS(t testing.TB, argv ...string) {
	t.Helper()
	RunCmd(t, append([]string{"nsenter", "--net=" + h.Netns}, argv...)...)
}

// TwoHosts makes hosts A (the sandbox of e) and B (a second sandbox), each
// with a network namespace, joined by a veth pair 10.99.N.1 - .2; self is
// the vmsup binary. All of it goes when the test ends.
func TwoHosts(t *testing.T, e *testenv.Env, self string) (a, b *Host) {
	t.Helper()
	ctx := Context(t, time.Minute)
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
	a = &Host{Name: "A", SD: e.Systemd, NS: "vmsupmigA" + tag, Addr: net + "1", Dev: "vmA" + tag, env: e, self: self}
	b = &Host{Name: "B", SD: sdB, NS: "vmsupmigB" + tag, Addr: net + "2", Dev: "vmB" + tag, env: e, self: self}
	for _, h := range []*Host{a, b} {
		RunCmd(t, "nsenter", "-t", fmt.Sprint(h.SD.PID1), "-m", "-p", "ip", "netns", "add", h.NS)
		t.Cleanup(func() {
			exec.Command("nsenter", "-t", fmt.Sprint(h.SD.PID1), "-m", "-p", "ip", "netns", "delete", h.NS).Run()
		})
		h.Netns = fmt.Sprintf("/proc/%d/root/run/netns/%s", h.SD.PID1, h.NS)
		h.Root = filepath.Join(dir, "root"+h.Name)
		h.QEMU, h.Caps = e.QEMU, e.Caps
		h.Dial = dialIn(h.Netns)
		h.Sup = h.WithHook(t, nil)
	}
	// The pair is made in the test's namespace and moved at once.
	RunCmd(t, "ip", "link", "add", a.Dev, "type", "veth", "peer", "name", b.Dev)
	for _, h := range []*Host{a, b} {
		RunCmd(t, "nsenter", "-t", fmt.Sprint(h.SD.PID1), "-m", "-p", "ip", "link", "set", h.Dev, "netns", h.NS)
		h.InNS(t, "ip", "link", "set", "lo", "up")
		h.InNS(t, "ip", "addr", "add", h.Addr+"/24", "dev", h.Dev)
		h.InNS(t, "ip", "link", "set", h.Dev, "up")
	}
	return a, b
}

// ExpectOnlyOn checks that the VM runs on one host and that the other knows
// nothing of it (no state directory, no unit).
func ExpectOnlyOn(t *testing.T, ctx context.Context, name string, on, off *Host) {
	t.Helper()
	st, err := on.Sup.Status(ctx, name)
	if err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("host %s: want running, got %+v %v", on.Name, st, err)
	}
	if _, err := off.Sup.Status(ctx, name); !errors.Is(err, supervisor.ErrNotFound) {
		t.Fatalf("host %s: want no such VM, got %v", off.Name, err)
	}
	if ls, err := off.Sup.List(ctx); err != nil || len(ls) != 0 {
		t.Fatalf("host %s: vmsup ls shows %+v %v", off.Name, ls, err)
	}
	if out, _ := off.SD.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+name+"*"); strings.TrimSpace(string(out)) != "" {
		t.Fatalf("host %s: units left: %s", off.Name, out)
	}
	for _, d := range []string{"vms", "records"} {
		ents, _ := os.ReadDir(filepath.Join(off.Root, d))
		var names []string
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") { // lock files stay beside the VM directories
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			t.Fatalf("host %s: state left in %s: %v", off.Name, d, names)
		}
	}
}

// AfterPrepared returns an AfterStep hook that runs fn once, d after the
// step "migrate-prepared": a fault injected while the stream flows.
func AfterPrepared(d time.Duration, fn func()) func(vm, step string) {
	return func(vm, step string) {
		if step == "migrate-prepared" {
			go func() { time.Sleep(d); fn() }()
		}
	}
}

// WithHook returns a supervisor for host h whose AfterStep is hook; it is
// closed when the test ends.
func (h *Host) WithHook(t *testing.T, hook func(vm, step string)) *supervisor.Supervisor {
	s, err := supervisor.New(supervisor.Options{Root: h.Root, SystemdBus: h.SD.BusAddress, JournalDir: h.SD.JournalDir, HostCaps: h.Caps,
		Self: h.self, QEMU: h.QEMU, AfterStep: hook, UnitDir: h.UnitDir(), BootTarget: testenv.BootTarget,
		RunDir: filepath.Join(h.Root, "run"), AllowPaths: h.env.AllowPaths, BlockDirs: h.env.BlockDirs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// KillUnit sends SIGKILL to every process in the unit of sd; a unit with
// none is an error of the test.
func KillUnit(t *testing.T, sd *testenv.Systemd, unit string) {
	pids, _ := sd.HostPIDs(unit)
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	if len(pids) == 0 {
		t.Errorf("no process in %s to kill", unit)
	}
}

// PutQEMU10 makes h a host that runs QEMU 10: QEMU 10 put in place in its
// sandbox's mount namespace (testenv.PutQEMU10, undone when the test
// ends), its probe's record taken there (`vmsup host`) for its supervisors
// (Sup is a new one), and its receiver (Transport) run there, so that a
// migration to it starts QEMU 10 as it would on an upgraded host.
func (h *Host) PutQEMU10(t *testing.T) {
	t.Helper()
	ctx := Context(t, 2*time.Minute)
	undo, err := testenv.PutQEMU10(ctx, h.SD.PID1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := undo(context.Background()); err != nil {
			t.Errorf("host %s: take QEMU 10 away again: %v", h.Name, err)
		}
	})
	h.enter = []string{"nsenter", "-t", fmt.Sprint(h.SD.PID1), "-m", "-p", "--"}
	cmd := exec.CommandContext(ctx, h.enter[0], append(h.enter[1:], h.self, "--json", "host")...)
	cmd.Env = append(os.Environ(), "VMSUP_ROOT="+h.Root, "VMSUP_QEMU="+h.QEMU)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("host %s: vmsup host under QEMU 10: %v\n%s", h.Name, err, out)
	}
	var c supervisor.HostCaps
	if err := json.Unmarshal(out, &c); err != nil || !strings.HasPrefix(c.QEMU.Version, "10.") {
		t.Fatalf("host %s: the probe under QEMU 10 found QEMU %q (%v)", h.Name, c.QEMU.Version, err)
	}
	h.Caps = &c
	h.Sup = h.WithHook(t, nil)
}
