// Package fleettest runs a whole fleet on one machine, for the fleet's
// tests and benchmarks: a LAN (a bridge in the caller's network namespace)
// with a 3-member etcd (TLS) and, optionally, a Ceph cluster on it, and
// hosts that are systemd sandboxes in network namespaces of their own,
// each running `vmsup agent` as a service (Restart=always), as a real host
// would. Everything is started here and stopped by Close, by pid.
package fleettest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/dev/testenv/etcdtest"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// Options shape a fleet.
type Options struct {
	Hosts  int    // default 3
	CPUs   int    // vCPUs each host offers; default 4
	Memory string // memory each host offers; default "1G"
	Ceph   bool   // a Ceph cluster on the LAN (shared disks, fencing)
	Bridge string // the LAN's bridge; default one free, "vmsfl" and a number
}

// Fleet is a running fleet.
type Fleet struct {
	LAN   *testenv.LAN
	Etcd  *etcdtest.Cluster
	Ceph  *testenv.Ceph // nil without Options.Ceph
	Hosts []*Host
	// Env points the CLI at the fleet's etcd (VMSUP_ETCD_*).
	Env []string

	env      *testenv.Env
	vmsupBin string
	closers  []func()
}

// Host is one host: its sandbox, its LAN address, its vmsup root, and a
// supervisor on them for looking at its VMs.
type Host struct {
	Name string
	SD   *testenv.Systemd
	Addr string
	Root string
	Sup  *supervisor.Supervisor
}

// Start brings the fleet up under dir (removed by Close); e gives the
// QEMU, the host probe's cache and the guest, vmsupBin the CLI the agents
// run. On error nothing is left running.
func Start(ctx context.Context, e *testenv.Env, vmsupBin, dir string, o Options) (_ *Fleet, err error) {
	if o.Hosts == 0 {
		o.Hosts = 3
	}
	if o.CPUs == 0 {
		o.CPUs = 4
	}
	if o.Memory == "" {
		o.Memory = "1G"
	}

	f := &Fleet{env: e, vmsupBin: vmsupBin}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if f.LAN, err = newLAN(o.Bridge); err != nil {
		return nil, err
	}
	f.closers = append(f.closers, func() { f.LAN.Close() })
	cephErr := make(chan error, 1)
	if o.Ceph {
		// Ceph starts beside etcd: it takes longer.
		go func() {
			var err error
			f.Ceph, err = testenv.StartCephOn(ctx, filepath.Join(dir, "ceph"), f.LAN.Addr)
			cephErr <- err
		}()
	} else {
		cephErr <- nil
	}
	f.Etcd, err = etcdtest.Start(ctx, filepath.Join(dir, "etcd"), etcdtest.Options{IP: f.LAN.Addr, TLS: true})
	if cerr := <-cephErr; f.Ceph != nil {
		f.closers = append(f.closers, func() { f.Ceph.Stop() })
		err = errors.Join(err, cerr)
	} else if cerr != nil {
		err = errors.Join(err, fmt.Errorf("ceph on the LAN: %w", cerr))
	}
	if f.Etcd != nil {
		f.closers = append(f.closers, func() { f.Etcd.Close() })
	}
	if err != nil {
		return nil, err
	}
	f.Env = []string{
		"VMSUP_ETCD_ENDPOINTS=" + strings.Join(f.Etcd.Endpoints(), ","),
		"VMSUP_ETCD_CA=" + f.Etcd.CAFile, "VMSUP_ETCD_CERT=" + f.Etcd.CertFile, "VMSUP_ETCD_KEY=" + f.Etcd.KeyFile,
		"VMSUP_ETCD_PREFIX=/fleettest/"}
	for i := range o.Hosts {
		h, err := f.addHost(ctx, dir, fmt.Sprintf("h%d", i+1), 11+i, o.CPUs, o.Memory)
		if err != nil {
			return nil, err
		}
		f.Hosts = append(f.Hosts, h)
	}
	// Every agent registered: the fleet is up as an operator finds it.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		out, err := f.VMSUP("fleet", "hosts", "--json")
		var doc struct{ Hosts []struct{ Name string } }
		if err == nil && json.Unmarshal([]byte(out), &doc) == nil && len(doc.Hosts) == len(f.Hosts) {
			return f, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the agents did not all register within a minute: %s %v", out, err)
		}
	}
}

// Close stops the hosts (their VMs with them), etcd, Ceph and the LAN.
func (f *Fleet) Close() {
	for i := len(f.closers) - 1; i >= 0; i-- {
		f.closers[i]()
	}
	f.closers = nil
}

func (f *Fleet) addHost(ctx context.Context, dir, name string, n, cpus int, memory string) (*Host, error) {
	// The sandbox's directory holds its bus socket: a short path.
	sdDir, err := os.MkdirTemp("", "vmsup-fl-")
	if err != nil {
		return nil, err
	}
	sd, err := testenv.StartSystemdHost(ctx, sdDir)
	if err != nil {
		os.RemoveAll(sdDir)
		return nil, fmt.Errorf("host %s: %w", name, err)
	}
	h := &Host{Name: name, SD: sd, Root: filepath.Join(dir, "root-"+name)}
	f.closers = append(f.closers, func() { sd.Stop(); os.RemoveAll(sdDir) })
	if h.Addr, err = f.LAN.Join(sd, n); err != nil {
		return nil, err
	}
	unitDir, runDir := filepath.Join(h.Root, "etc-systemd"), filepath.Join(h.Root, "run")
	if h.Sup, err = supervisor.New(supervisor.Options{Root: h.Root, SystemdBus: sd.BusAddress, JournalDir: sd.JournalDir,
		HostCaps: f.env.Caps, QEMU: f.env.QEMU, Self: f.vmsupBin, UnitDir: unitDir, BootTarget: testenv.BootTarget, RunDir: runDir,
		AllowPaths: f.env.AllowPaths, BlockDirs: f.env.BlockDirs}); err != nil {
		return nil, err
	}
	f.closers = append(f.closers, func() { h.Sup.Close() })
	unit := fmt.Sprintf(`[Unit]
Description=vmsup fleet agent (test host %s)

[Service]
ExecStart=%s agent --host %s --cpus %d --memory %s --labels zone=%s --migration-address %s --migration-port 7788
Restart=always
RestartSec=1
Environment=%s
Environment=VMSUP_ROOT=%s VMSUP_QEMU=%s VMSUP_UNIT_DIR=%s VMSUP_BOOT_TARGET=%s VMSUP_RUN_DIR=%s VMSUP_HOST_CACHE=%s
Environment=VMSUP_ALLOW_PATHS=%s VMSUP_BLOCK_DIRS=%s
`, name, f.vmsupBin, name, cpus, memory, name, h.Addr, strings.Join(f.Env, " "),
		h.Root, f.env.QEMU, unitDir, testenv.BootTarget, runDir, f.env.CapsCache,
		strings.Join(f.env.AllowPaths, ":"), strings.Join(f.env.BlockDirs, ":"))
	if err := os.WriteFile(filepath.Join(sd.UnitDir, "vmsup-agent.service"), []byte(unit), 0o644); err != nil {
		return nil, err
	}
	for _, args := range [][]string{{"daemon-reload"}, {"start", "vmsup-agent.service"}} {
		if out, err := sd.Systemctl(ctx, args...); err != nil {
			return nil, fmt.Errorf("host %s: systemctl %v: %v %s", name, args, err, out)
		}
	}
	return h, nil
}

// Host is the host of that name (nil if none).
func (f *Fleet) Host(name string) *Host {
	for _, h := range f.Hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// AgentPID is the host PID of the host's agent (0 if none runs).
func (h *Host) AgentPID() int {
	pids, _ := h.SD.HostPIDs("vmsup-agent.service")
	if len(pids) == 0 {
		return 0
	}
	return pids[0]
}

// AgentLog is the agent's journal.
func (h *Host) AgentLog() string {
	j, _ := h.SD.Journal(context.Background(), "vmsup-agent.service")
	return j
}

// QEMUPID is the host PID of the VM's QEMU on h (0 if it does not run there).
func (h *Host) QEMUPID(vm string) int {
	return supervisortest.QEMUPID(h.SD, "vmsup-"+vm+".service")
}

// VMSUP runs the CLI against the fleet: stdout, and an error carrying
// stderr if it fails.
func (f *Fleet) VMSUP(args ...string) (string, error) {
	return f.VMSUPEnv(f.Env, args...)
}

// VMSUPEnv is VMSUP with env (which should include f.Env) in place of f.Env.
func (f *Fleet) VMSUPEnv(env []string, args ...string) (string, error) {
	cmd := exec.Command(f.vmsupBin, args...)
	cmd.Env = append(append(os.Environ(), f.env.CLIEnv()...), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("vmsup %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// VM is a line of fleet ls --json.
type VM struct {
	Name, Host, Target, State, Reason string
	Generation                        int64
}

// Ls is fleet ls --json: the VMs by name, and its note.
func (f *Fleet) Ls() (map[string]VM, string, error) {
	out, err := f.VMSUP("fleet", "ls", "--json")
	if err != nil {
		return nil, "", err
	}
	var doc struct {
		VMs  []VM   `json:"vms"`
		Note string `json:"note"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return nil, "", fmt.Errorf("fleet ls --json: %w: %s", err, out)
	}
	m := map[string]VM{}
	for _, v := range doc.VMs {
		m[v.Name] = v
	}
	return m, doc.Note, nil
}

// WaitLs polls fleet ls until ok says so; after d it fails with the last
// listing.
func (f *Fleet) WaitLs(ctx context.Context, d time.Duration, ok func(map[string]VM) bool) (map[string]VM, error) {
	deadline := time.Now().Add(d)
	for {
		vms, _, err := f.Ls()
		if err == nil && ok(vms) {
			return vms, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return vms, fmt.Errorf("not after %s; fleet ls: %+v (%v)", d, vms, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// CounterGuest writes NAME.toml in dir: the test guest under TCG, printing
// a counter on its console, with extra top-level keys and tables.
func CounterGuest(e *testenv.Env, dir, name, memory, extra string) (string, error) {
	return guestFile(e, dir, name, memory, "console=ttyS0 no_timer_check vmsup.counter", extra)
}

// QuietGuest is CounterGuest without the counter: an idle guest costs a
// TCG host far less CPU than one printing five lines a second.
func QuietGuest(e *testenv.Env, dir, name, memory, extra string) (string, error) {
	return guestFile(e, dir, name, memory, "console=ttyS0 no_timer_check", extra)
}

func guestFile(e *testenv.Env, dir, name, memory, cmdline, extra string) (string, error) {
	path := filepath.Join(dir, name+".toml")
	body := fmt.Sprintf(`name = %q
memory = %q
accel = "tcg"
stop_timeout = "5s"
%s
[boot]
kernel = %q
initrd = %q
cmdline = %q
`, name, memory, extra, e.Guest.Kernel, e.Guest.Initrd, cmdline)
	return path, os.WriteFile(path, []byte(body), 0o644)
}

// newLAN makes the fleet's LAN on a bridge and a 10.98.N.0/24 no other
// run on this machine uses (a second run beside the first failed with
// "bind: address already in use"): N starts from the pid and skips a
// subnet any interface has an address in, or whose bridge exists.
func newLAN(bridge string) (*testenv.LAN, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	used := map[int]bool{}
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && ip.IP[len(ip.IP)-4] == 10 && ip.IP[len(ip.IP)-3] == 98 {
			used[int(ip.IP[len(ip.IP)-2])] = true
		}
	}
	start := os.Getpid() % 250
	for i := range 250 {
		n := (start+i)%250 + 1
		name := bridge
		if name == "" {
			name = fmt.Sprintf("vmsfl%d", n)
		}
		if _, err := net.InterfaceByName(name); used[n] || err == nil {
			continue
		}
		return testenv.NewLAN(name, fmt.Sprintf("10.98.%d.", n))
	}
	return nil, errors.New("fleettest: no free 10.98.N.0/24 and bridge for the fleet's LAN")
}

// LocalDir makes dir a directory of h's own, as a host's local disk is: a
// tmpfs mounted at dir in its sandbox's mount namespace (where its agent,
// receiver and QEMUs run). Other hosts, and the caller, see their own dir.
// The returned func unmounts it.
func (h *Host) LocalDir(dir, size string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if out, err := h.InMounts("mount", "-t", "tmpfs", "-o", "mode=0755,size="+size, "vmsup-local-"+h.Name, dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("host %s: mount a local %s: %v: %s", h.Name, dir, err, out)
	}
	return func() { _ = h.InMounts("umount", "-l", dir).Run() }, nil
}

// HasFile says whether path is a regular file in h's mount namespace.
func (h *Host) HasFile(path string) bool {
	return h.InMounts("test", "-f", path).Run() == nil
}

// InMounts is the command argv run in h's sandbox's mount namespace.
func (h *Host) InMounts(argv ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"-t", fmt.Sprint(h.SD.PID1), "-m", "--"}, argv...)...)
}
