package fleettest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/testenv"
	"github.com/vmsup/vmsup/internal/testenv/etcdtest"
	"github.com/vmsup/vmsup/supervisor"
)

// fleetHost is one host of the fleet tests: a systemd sandbox in a network
// namespace of its own on the test's LAN, with its own vmsup root and an
// agent run by its systemd as a service (Restart=always), as on a real host.
type fleetHost struct {
	name string
	sd   *testenv.Systemd
	addr string
	root string
	sup  *supervisor.Supervisor // the test's view of the host (status, console)
}

// testFleet is the LAN, the etcd cluster on it, and the hosts.
type testFleet struct {
	lan   *testenv.LAN
	etcd  *etcdtest.Cluster
	hosts []*fleetHost
	env   []string // VMSUP_ETCD_* for the CLI and the agents
}

// newFleet starts etcd (3 members, TLS) on a LAN and n hosts joined to it,
// each with an agent offering cpus vCPUs and memory.
func newFleet(t *testing.T, n int, cpus int, memory string) *testFleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("10.98.%d.", os.Getpid()%250+1)
	lan, err := testenv.NewLAN("vmsfleetbr0", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lan.Close() })
	etcd, err := etcdtest.Start(ctx, t.TempDir(), etcdtest.Options{IP: lan.Addr, TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	f := &testFleet{lan: lan, etcd: etcd, env: []string{
		"VMSUP_ETCD_ENDPOINTS=" + strings.Join(etcd.Endpoints(), ","),
		"VMSUP_ETCD_CA=" + etcd.CAFile, "VMSUP_ETCD_CERT=" + etcd.CertFile, "VMSUP_ETCD_KEY=" + etcd.KeyFile,
		"VMSUP_ETCD_PREFIX=/fleettest/"}}
	for i := range n {
		f.hosts = append(f.hosts, f.addHost(t, ctx, fmt.Sprintf("h%d", i+1), 11+i, cpus, memory))
	}
	return f
}

func (f *testFleet) addHost(t *testing.T, ctx context.Context, name string, n, cpus int, memory string) *fleetHost {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmsup-fl-")
	if err != nil {
		t.Fatal(err)
	}
	sd, err := testenv.StartSystemdHost(ctx, dir)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("host %s: %v", name, err)
	}
	h := &fleetHost{name: name, sd: sd, root: filepath.Join(t.TempDir(), "root-"+name)}
	t.Cleanup(func() {
		// The VMs first (their units stop with the sandbox anyway).
		sd.Stop()
		os.RemoveAll(dir)
	})
	if h.addr, err = f.lan.Join(sd, n); err != nil {
		t.Fatal(err)
	}
	h.sup, err = supervisor.New(supervisor.Options{Root: h.root, SystemdBus: sd.BusAddress, JournalDir: sd.JournalDir,
		HostCaps: env.Caps, QEMU: env.QEMU, Self: vmsupBin, UnitDir: filepath.Join(h.root, "etc-systemd"),
		BootTarget: testenv.BootTarget, RunDir: filepath.Join(h.root, "run")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.sup.Close() })
	unit := fmt.Sprintf(`[Unit]
Description=vmsup fleet agent (test host %s)

[Service]
ExecStart=%s agent --host %s --cpus %d --memory %s --labels zone=%s --migration-address %s
Restart=always
RestartSec=1
Environment=%s
Environment=VMSUP_ROOT=%s VMSUP_QEMU=%s VMSUP_UNIT_DIR=%s VMSUP_BOOT_TARGET=%s VMSUP_RUN_DIR=%s VMSUP_HOST_CACHE=%s
`, name, vmsupBin, name, cpus, memory, name, h.addr, strings.Join(f.env, " "),
		h.root, env.QEMU, filepath.Join(h.root, "etc-systemd"), testenv.BootTarget, filepath.Join(h.root, "run"), env.CapsCache)
	if err := os.WriteFile(filepath.Join(sd.UnitDir, "vmsup-agent.service"), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"daemon-reload"}, {"start", "vmsup-agent.service"}} {
		if out, err := sd.Systemctl(ctx, args...); err != nil {
			t.Fatalf("host %s: systemctl %v: %v %s", name, args, err, out)
		}
	}
	return h
}

// agentPID is the host PID of the host's agent (0 if none runs).
func (h *fleetHost) agentPID() int {
	pids, _ := h.sd.HostPIDs("vmsup-agent.service")
	if len(pids) == 0 {
		return 0
	}
	return pids[0]
}

// agentLog is the agent's journal.
func (h *fleetHost) agentLog(t *testing.T) string {
	j, _ := h.sd.Journal(context.Background(), "vmsup-agent.service")
	return j
}

// vmsup runs the CLI against the fleet; it returns stdout and the error
// (with stderr) of a failed run.
func (f *testFleet) vmsup(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(vmsupBin, args...)
	cmd.Env = append(os.Environ(), f.env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("vmsup %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// fleetVM is a line of fleet ls --json.
type fleetVM struct {
	Name, Host, Target, State, Reason string
	Generation                        int64
}

// ls is fleet ls --json: the VMs by name, and the note.
func (f *testFleet) ls(t *testing.T) (map[string]fleetVM, string) {
	t.Helper()
	out, err := f.vmsup(t, "fleet", "ls", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		VMs  []fleetVM `json:"vms"`
		Note string    `json:"note"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("fleet ls --json: %v: %s", err, out)
	}
	m := map[string]fleetVM{}
	for _, v := range doc.VMs {
		m[v.Name] = v
	}
	return m, doc.Note
}

// waitLs polls fleet ls until ok says so, or fails after d with the last
// listing and the agents' log tails.
func (f *testFleet) waitLs(t *testing.T, d time.Duration, what string, ok func(map[string]fleetVM) bool) map[string]fleetVM {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		vms, _ := f.ls(t)
		if ok(vms) {
			return vms
		}
		if time.Now().After(deadline) {
			for _, h := range f.hosts {
				t.Logf("agent %s:\n%s", h.name, tail(h.agentLog(t), 1500))
			}
			t.Fatalf("%s: not after %s; fleet ls: %+v", what, d, vms)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// qemuPID is the host PID of the VM's QEMU on h (0 if it does not run there).
func (h *fleetHost) qemuPID(vm string) int {
	pids, _ := h.sd.HostPIDs("vmsup-" + vm + ".service")
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.HasPrefix(string(b), "qemu-system") {
			return p
		}
	}
	return 0
}

// counterGuest writes a VM file for the test guest printing a counter on
// its console, with extra top-level keys and tables.
func counterGuest(t *testing.T, dir, name, memory, extra string) string {
	t.Helper()
	path := filepath.Join(dir, name+".toml")
	body := fmt.Sprintf(`name = %q
memory = %q
accel = "tcg"
stop_timeout = "5s"
%s
[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 vmsup.counter"
`, name, memory, extra, env.Guest.Kernel, env.Guest.Initrd)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
