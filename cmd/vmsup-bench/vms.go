package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/host/posixacl"
	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/units"
)

// vmKind is the shape of a benchmark VM.
type vmKind int

const (
	// kindIdle: no guest OS, KVM, SeaBIOS finds a blank read-only disk and
	// waits; only start-up, QMP and memory are measured. Used where the host
	// probe says QEMU starts under KVM (fixture.idle), else kindIdleTCG.
	kindIdle vmKind = iota
	// kindIdleTCG: the same under TCG. Many idle VMs at once use it: an idle
	// KVM VM on this PVM host spins (~60% of a core each, measured), an idle
	// TCG one costs ~1%.
	kindIdleTCG
	// kindGuest: the test guest under TCG, to its console marker; handles
	// ACPI power-off.
	kindGuest
)

func (k vmKind) accel() string {
	if k == kindIdle {
		return "kvm"
	}
	return "tcg"
}

type guestFiles struct{ kernel, initrd string }

// specFile writes NAME.toml under dir for vmsup and returns its path. The
// idle VM's stop_timeout is 1 ms: with no guest OS to honour the ACPI
// powerdown, vmsup down then goes straight to QMP quit (its forced stop).
func specFile(dir, name string, k vmKind, memMiB int, disk string, g guestFiles) (string, error) {
	var body string
	switch k {
	case kindIdle, kindIdleTCG:
		body = fmt.Sprintf(`name = %q
memory = "%dM"
accel = "`+k.accel()+`"
hotplug_slots = 0
guest_agent = false
stop_timeout = "1ms"

[[disk]]
name = "blank"
file = %q
format = "raw"
read_only = true
`, name, memMiB, disk)
	case kindGuest:
		body = fmt.Sprintf(`name = %q
memory = "%dM"
accel = "tcg"
hotplug_slots = 0
guest_agent = false
stop_timeout = "20s"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0"
`, name, memMiB, g.kernel, g.initrd)
	}
	path := filepath.Join(dir, name+".toml")
	return path, os.WriteFile(path, []byte(body), 0o644)
}

// rawVM is QEMU run directly, as the bench's own child, with vmsup's argv.
type rawVM struct {
	name    string
	cmd     *exec.Cmd
	done    chan struct{}
	qmp     string
	events  string
	console string // the console log file
	conn    *rawClient
}

// rawPlan is what a raw QEMU runs: vmsup's argv, its state directory, and
// the file its console goes to.
type rawPlan struct {
	argv         []string
	dir, console string
}

// rawArgv returns the argv of the machine vmsup would run for the VM in
// path, with its sockets under rawSup's root, and makes that state
// directory. Its disks are named by path (Supervisor.Argv): raw QEMU
// boots the same machine without vmsup passing them as descriptors.
func rawArgv(rawSup *supervisor.Supervisor, path string) (rawPlan, error) {
	f, err := spec.Load(path)
	if err != nil {
		return rawPlan{}, err
	}
	argv, err := rawSup.Argv(f)
	if err != nil {
		return rawPlan{}, err
	}
	p := vmstore.Store{Root: rawSup.Root()}.Paths(f.VM.Name)
	// vmsup's argv logs the console into its logger's FIFO; with no
	// logger here, QEMU makes that path a plain file.
	console := companion.FIFO(p, vmstore.UnitName(f.VM.Name))
	if !logsConsoleTo(argv, console) {
		return rawPlan{}, fmt.Errorf("%s: vmsup's argv does not log the console to %s", path, console)
	}
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return rawPlan{}, err
	}
	// The event log's two files, which vmsup makes before QEMU opens them.
	for sfx, data := range map[string]string{".in": qemuargs.EventLogInput, ".out": ""} {
		if err := os.WriteFile(filepath.Join(p.Dir, "events"+sfx), []byte(data), 0o600); err != nil {
			return rawPlan{}, err
		}
	}
	return rawPlan{argv: argv, dir: p.Dir, console: console}, nil
}

// logsConsoleTo says whether argv's console chardev logs to path.
func logsConsoleTo(argv []string, path string) bool {
	for _, a := range argv {
		if strings.Contains(a, ",id="+qemuargs.ConsoleChardevID+",") &&
			strings.Contains(a+",", ",logfile="+strings.ReplaceAll(path, ",", ",,")+",") {
			return true
		}
	}
	return false
}

// startRaw execs QEMU with p's argv; it does not wait for QMP. cgroupProcs,
// when set, is the cgroup.procs file QEMU is moved into right after exec.
func startRaw(name string, p rawPlan, cgroupProcs string) (*rawVM, error) {
	v := &rawVM{name: name, done: make(chan struct{}), qmp: filepath.Join(p.dir, "qmp.sock"),
		events: filepath.Join(p.dir, "events.sock"), console: p.console}
	for _, s := range []string{v.qmp, v.events, filepath.Join(p.dir, "console.sock"), v.console} {
		os.Remove(s)
	}
	v.cmd = exec.Command(p.argv[0], p.argv[1:]...)
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		return nil, fmt.Errorf("raw %s: %w", name, err)
	}
	go func() { v.cmd.Wait(); close(v.done) }()
	if cgroupProcs != "" {
		if err := os.WriteFile(cgroupProcs, []byte(strconv.Itoa(v.cmd.Process.Pid)), 0o644); err != nil {
			v.kill()
			return nil, fmt.Errorf("raw %s: move into %s: %w", name, cgroupProcs, err)
		}
	}
	return v, nil
}

// waitRunning polls the QMP socket every millisecond until QEMU answers
// query-status with "running", and keeps the connection for quit.
func (v *rawVM) waitRunning(ctx context.Context) error {
	c, err := dialRawQMP(ctx, v.qmp, v.done)
	if err != nil {
		return fmt.Errorf("raw %s: %w", v.name, err)
	}
	v.conn = c
	return c.expectRunning()
}

// quit sends QMP quit and waits for the process to exit.
func (v *rawVM) quit(ctx context.Context) error {
	return v.stopWith(ctx, `{"execute":"quit"}`)
}

// powerdown sends system_powerdown and waits for the guest to power off.
func (v *rawVM) powerdown(ctx context.Context) error {
	return v.stopWith(ctx, `{"execute":"system_powerdown"}`)
}

func (v *rawVM) stopWith(ctx context.Context, cmd string) error {
	if v.conn == nil {
		c, err := dialRawQMP(ctx, v.qmp, v.done)
		if err != nil {
			return err
		}
		v.conn = c
	}
	_, _ = v.conn.call(cmd) // quit's reply may be lost as QEMU exits
	select {
	case <-v.done:
		v.conn.Close()
		v.conn = nil
		return nil
	case <-ctx.Done():
		return fmt.Errorf("raw %s did not exit: %w", v.name, ctx.Err())
	}
}

// kill ends the process if it still runs (clean-up only).
func (v *rawVM) kill() {
	if v == nil || v.cmd == nil || v.cmd.Process == nil {
		return
	}
	select {
	case <-v.done:
	default:
		v.cmd.Process.Kill()
		<-v.done
	}
	if v.conn != nil {
		v.conn.Close()
	}
}

// rawClient is the smallest honest QMP client: one socket, newline-framed
// JSON, events skipped while waiting for a reply.
type rawClient struct {
	net.Conn
	r *bufio.Reader
}

type rawReply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// dialRawQMP connects (retrying every millisecond until ctx ends or dead
// closes), reads the greeting and negotiates capabilities.
func dialRawQMP(ctx context.Context, path string, dead <-chan struct{}) (*rawClient, error) {
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			rc := &rawClient{Conn: c, r: bufio.NewReader(c)}
			if _, err := rc.r.ReadBytes('\n'); err != nil {
				c.Close()
				return nil, fmt.Errorf("QMP greeting: %w", err)
			}
			if _, err := rc.call(`{"execute":"qmp_capabilities"}`); err != nil {
				c.Close()
				return nil, err
			}
			return rc, nil
		}
		select {
		case <-dead:
			return nil, errors.New("QEMU exited before QMP answered")
		case <-ctx.Done():
			return nil, fmt.Errorf("QMP %s: %w (last: %v)", path, ctx.Err(), err)
		case <-time.After(time.Millisecond):
		}
	}
}

func (c *rawClient) call(cmd string) (json.RawMessage, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(cmd + "\n")); err != nil {
		return nil, err
	}
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var r rawReply
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, err
		}
		if r.Event != "" {
			continue
		}
		if r.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s", r.Error.Class, r.Error.Desc)
		}
		return r.Return, nil
	}
}

func (c *rawClient) expectRunning() error {
	ret, err := c.call(`{"execute":"query-status"}`)
	if err != nil {
		return err
	}
	var st struct{ Status string }
	if err := json.Unmarshal(ret, &st); err != nil {
		return err
	}
	if st.Status != "running" {
		return fmt.Errorf("QEMU is %q", st.Status)
	}
	return nil
}

// bareUnit is the same argv in a transient systemd unit without vmsup: the
// same properties as vmsup's unit but no ExecStop= hook.
func bareUnit(name string, argv []string, memMiB int, kvm bool) units.Unit {
	u := units.Unit{
		Name:        "bench-" + name + ".service",
		Description: "bench bare unit " + name,
		Slice:       "vmsup.slice",
		Argv:        argv,
		MemoryMax:   uint64(memMiB+256) << 20,
		TasksMax:    4096,
		UMask:       0o077,
	}
	if kvm {
		u.DeviceAllow = []units.DeviceRule{{Path: "/dev/kvm", Access: "rw"}}
	}
	return u
}

// confinedSandbox is the sandbox vmsup puts around a VM with the one
// read-only disk and no NICs, for the VM state directory dir: QEMU runs as
// supervisor.SharedQEMUUser, which owns dir; the other VMs' directories are
// hidden. The directories above dir must be traversable by that user.
func confinedSandbox(dir, disk string, kvm bool) (*units.Sandbox, error) {
	uid, gid, err := qemuUser()
	if err != nil {
		return nil, err
	}
	for _, p := range []string{dir, filepath.Join(dir, "events.in"), filepath.Join(dir, "events.out")} {
		if err := os.Chown(p, uid, gid); err != nil {
			return nil, err
		}
	}
	for d := filepath.Dir(dir); d != "/" && d != filepath.Dir(filepath.Dir(filepath.Dir(dir))); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, err
		}
	}
	sb := &units.Sandbox{
		User: supervisor.SharedQEMUUser, Group: supervisor.SharedQEMUUser,
		ReadWritePaths: []string{dir},
		BindPaths:      []string{dir, disk},
		HidePaths:      []string{filepath.Dir(dir)},
	}
	if kvm {
		sb.Devices = []units.DeviceRule{{Path: "/dev/kvm", Access: "rw"}}
	}
	return sb, nil
}

// keepKVMACL returns a function that puts the QEMU user's ACL entry on
// /dev/kvm back as it was before (the confined variant adds one).
func keepKVMACL(kvm bool) func() {
	if !kvm {
		return func() {}
	}
	uid, _, err := qemuUser()
	if err != nil {
		return func() {}
	}
	prev, err := posixacl.UserEntry("/dev/kvm", uint32(uid))
	if err != nil {
		return func() {}
	}
	return func() { _ = posixacl.RevokeUser("/dev/kvm", uint32(uid), prev) }
}

// qemuUser returns the QEMU user's ids, creating it as vmsup would.
func qemuUser() (int, int, error) {
	u, err := user.Lookup(supervisor.SharedQEMUUser)
	if err != nil {
		out, cerr := exec.Command("useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", supervisor.SharedQEMUUser).CombinedOutput()
		if cerr != nil {
			return 0, 0, fmt.Errorf("create QEMU user: %v: %s", cerr, out)
		}
		if u, err = user.Lookup(supervisor.SharedQEMUUser); err != nil {
			return 0, 0, err
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// waitMarker polls a console log every 5 ms until it holds marker.
func waitMarker(ctx context.Context, path, marker string) error {
	m := []byte(marker)
	for {
		if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, m) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%q not in %s: %w", marker, path, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// rssOf returns a process's VmRSS in bytes, 0 when it is gone.
func rssOf(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// procInfo is one process from /proc.
type procInfo struct {
	pid, ppid int
	comm      string
	cmdline   []string
}

func listProcs() []procInfo {
	ents, _ := os.ReadDir("/proc")
	var out []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// comm is in parentheses and may hold spaces: split after the last ')'.
		s := string(stat)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if i < 0 || j < i {
			continue
		}
		rest := strings.Fields(s[j+1:])
		if len(rest) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(rest[1])
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, procInfo{pid: pid, ppid: ppid, comm: s[i+1 : j],
			cmdline: strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")})
	}
	return out
}

// qemuPID finds the QEMU whose -name is guest=NAME (vmsup, raw and libvirt
// all name it so).
func qemuPID(procs []procInfo, name string) int {
	want := "guest=" + name
	for _, p := range procs {
		if !strings.HasPrefix(p.comm, "qemu-system") {
			continue
		}
		for i, a := range p.cmdline {
			if a == "-name" && i+1 < len(p.cmdline) && (p.cmdline[i+1] == want || strings.HasPrefix(p.cmdline[i+1], want+",")) {
				return p.pid
			}
		}
	}
	return 0
}

// descendants returns pid and every process below it.
func descendants(procs []procInfo, pid int) []procInfo {
	var out []procInfo
	want := map[int]bool{pid: true}
	for changed := true; changed; {
		changed = false
		for _, p := range procs {
			if !want[p.pid] && want[p.ppid] {
				want[p.pid], changed = true, true
			}
		}
	}
	for _, p := range procs {
		if want[p.pid] {
			out = append(out, p)
		}
	}
	return out
}
