package units_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/units"
)

// TestSandboxStartCost measures what each part of vmsup's sandbox adds to a
// VM unit's start: QEMU (-S, no guest) in a transient unit, bare and with the
// full sandbox of a minimal VM (as supervisor.sandboxUnit builds it) and with
// one property group left out at a time, interleaved. It reports the start
// job's time and the time until QMP answers. Not for CI: set
// VMSUP_SANDBOX_PERF=1 (VMSUP_SANDBOX_PERF_REPS, _ACCEL=kvm|tcg, _OUT=file.md).
func TestSandboxStartCost(t *testing.T) {
	if os.Getenv("VMSUP_SANDBOX_PERF") == "" {
		t.Skip("set VMSUP_SANDBOX_PERF=1 to measure the sandbox's start cost")
	}
	reps := 10
	if r, err := strconv.Atoi(os.Getenv("VMSUP_SANDBOX_PERF_REPS")); err == nil && r > 0 {
		reps = r
	}
	kvm := os.Getenv("VMSUP_SANDBOX_PERF_ACCEL") != "tcg"
	m, _ := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	const qemuUser = "vmsup-qemu"
	usr, err := user.Lookup(qemuUser)
	if err != nil {
		t.Skipf("no %s user: %v", qemuUser, err)
	}
	uid, _ := strconv.Atoi(usr.Uid)
	gid, _ := strconv.Atoi(usr.Gid)
	// Outside /tmp and /home, so a variant without BindPaths still sees it.
	root, err := os.MkdirTemp("/var/lib", "vmsup-perf-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil { // MkdirTemp's 0700 would lock QEMU's user out
		t.Fatal(err)
	}
	images := filepath.Join(root, "images")
	for _, d := range []string{filepath.Join(root, "vms"), images} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if kvm {
		grantKVM(t, uint32(uid))
	}

	type variant struct {
		name string
		edit func(u *units.Unit) // changes the sandbox
		drop []string            // properties left out
		bare bool
	}
	vs := []variant{
		{name: "bare unit (root, no sandbox)", bare: true},
		{name: "full sandbox"},
		{name: "full sandbox (again: noise floor)"},
		{name: "- PrivateUsers", drop: []string{"PrivateUsers"}},
		{name: "- PrivateDevices + /dev/kvm bind", drop: []string{"PrivateDevices"}, edit: func(u *units.Unit) { u.Sandbox.Devices = nil }},
		{name: "- TemporaryFileSystem (HidePaths)", edit: func(u *units.Unit) { u.Sandbox.HidePaths = nil }},
		{name: "- BindPaths (VM files) + TemporaryFileSystem", edit: func(u *units.Unit) { u.Sandbox.HidePaths, u.Sandbox.BindPaths = nil, nil }},
		{name: "- ProtectProc + ProcSubset", drop: []string{"ProtectProc", "ProcSubset"}},
		{name: "- SystemCallFilter", drop: []string{"SystemCallFilter", "SystemCallErrorNumber"}},
		{name: "- PrivateTmp", drop: []string{"PrivateTmp"}},
		{name: "- ProtectSystem + ProtectHome", drop: []string{"ProtectSystem", "ProtectHome"}},
		{name: "- MemoryDenyWriteExecute", drop: []string{"MemoryDenyWriteExecute"}},
		{name: "- User= (root)", drop: []string{"User", "Group"}},
		{name: "- PrivateNetwork", drop: []string{"PrivateNetwork"}},
		{name: "- IPAddressDeny", drop: []string{"IPAddressDeny"}},
		{name: "- ProtectKernel*/ControlGroups/Clock/Hostname", drop: []string{"ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname"}},
		{name: "  - ProtectKernelTunables", drop: []string{"ProtectKernelTunables"}},
		{name: "  - ProtectKernelModules", drop: []string{"ProtectKernelModules"}},
		{name: "  - ProtectKernelLogs", drop: []string{"ProtectKernelLogs"}},
		{name: "  - ProtectControlGroups", drop: []string{"ProtectControlGroups"}},
		{name: "  - ProtectClock", drop: []string{"ProtectClock"}},
		{name: "  - ProtectHostname", drop: []string{"ProtectHostname"}},
		{name: "- every seccomp-based option", drop: []string{"SystemCallFilter", "SystemCallErrorNumber", "SystemCallArchitectures", "RestrictAddressFamilies", "MemoryDenyWriteExecute", "RestrictNamespaces", "LockPersonality", "RestrictRealtime", "RestrictSUIDSGID"}},
		{name: "host network (user-mode NIC shape)", edit: func(u *units.Unit) { u.Sandbox.HostNetwork = true }},
	}

	// VMSUP_SANDBOX_PERF_ONLY=a,b keeps the bare and full variants and those
	// whose name contains one of the words.
	if only := os.Getenv("VMSUP_SANDBOX_PERF_ONLY"); only != "" {
		vs = slices.DeleteFunc(vs, func(v variant) bool {
			if v.bare || strings.HasPrefix(v.name, "full") {
				return false
			}
			for _, w := range strings.Split(only, ",") {
				if strings.Contains(v.name, w) {
					return false
				}
			}
			return true
		})
	}
	{
		both := variant{name: "- IPAddressDeny - MemoryDenyWriteExecute", drop: []string{"IPAddressDeny", "MemoryDenyWriteExecute"}}
		vs = append(vs, both)
	}

	type vm struct {
		unit units.Unit
		drop map[string]bool
		sock string
	}
	build := func(i int, v variant, hostNet bool) vm {
		name := fmt.Sprintf("perf%d", i)
		if hostNet {
			name += "n"
		}
		dir := filepath.Join(root, "vms", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		owner, group := uid, gid
		if slices.Contains(v.drop, "User") { // root without capabilities: its own dir
			owner, group = 0, 0
		}
		if err := os.Chown(dir, owner, group); err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(dir, "qmp.sock")
		accel := []string{"-accel", "tcg,split-wx=on"}
		if kvm {
			accel = []string{"-accel", "kvm"}
		}
		argv := append([]string{"/usr/bin/qemu-system-x86_64"}, accel...)
		argv = append(argv, "-machine", "q35", "-nodefaults", "-display", "none", "-S",
			"-qmp", "unix:"+sock+",server=on,wait=off")
		// supervisor.unitFor's shape (the stop hook left out: only start is timed).
		u := units.Unit{Name: "vmsup-" + name + ".service", Description: "perf " + v.name, Slice: "vmsup.slice",
			Argv: argv, TimeoutStop: 20 * time.Second, MemoryMax: 768 << 20, TasksMax: 4096, UMask: 0o077}
		if kvm {
			u.DeviceAllow = []units.DeviceRule{{Path: "/dev/kvm", Access: "rw"}}
		}
		if !v.bare {
			// supervisor.sandboxUnit for a VM without NICs or disks.
			u.Sandbox = &units.Sandbox{User: qemuUser, Group: qemuUser,
				ReadWritePaths: []string{dir, images},
				BindPaths:      []string{dir, images},
				HidePaths:      []string{filepath.Dir(dir)},
				HostNetwork:    hostNet,
			}
			if kvm {
				u.Sandbox.Devices = []units.DeviceRule{{Path: "/dev/kvm", Access: "rw"}}
			}
			if v.edit != nil {
				v.edit(&u)
			}
		}
		drop := map[string]bool{}
		for _, d := range v.drop {
			drop[d] = true
		}
		return vm{u, drop, sock}
	}
	vms := make([]vm, len(vs))
	for i, v := range vs {
		vms[i] = build(i, v, false)
	}
	stop := func(x vm) {
		_ = m.Stop(ctx, x.unit.Name)
		_ = m.ResetFailed(ctx, x.unit.Name)
	}
	t.Cleanup(func() {
		for _, x := range vms {
			stop(x)
		}
	})

	job := make([][]time.Duration, len(vs))
	qmp := make([][]time.Duration, len(vs))
	fails := make([]int, len(vs))
	var firstErr = make([]string, len(vs))
	rng := rand.New(rand.NewPCG(1, 2))
	for r := 0; r < reps; r++ {
		// A fresh random order every repetition: no variant always
		// follows the same one (a unit's stop overlaps the next start).
		for _, i := range rng.Perm(len(vs)) {
			x := vms[i]
			os.Remove(x.sock)
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			t0 := time.Now()
			err := m.StartWithout(sctx, x.unit, x.drop)
			tj := time.Since(t0)
			if err == nil {
				err = waitQMP(sctx, x.sock)
			}
			tq := time.Since(t0)
			scancel()
			if err != nil {
				fails[i]++
				if firstErr[i] == "" {
					firstErr[i] = err.Error()
				}
				t.Logf("%s: %v", vs[i].name, err)
			} else {
				job[i] = append(job[i], tj)
				qmp[i] = append(qmp[i], tq)
			}
			time.Sleep(50 * time.Millisecond)
			stop(x)
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Exposure of each variant, as the VM without NICs and with a user-mode
	// NIC (HostNetwork, the shape MaxExposure is about).
	expo := func(x vm) string {
		if err := m.StartWithout(ctx, x.unit, x.drop); err != nil {
			return "start: " + err.Error()
		}
		defer stop(x)
		waitState(t, m, ctx, x.unit.Name, "active")
		e, err := units.AnalyzeSecurity(ctx, analyzeCmd(), "", x.unit.Name)
		if err != nil {
			return err.Error()
		}
		return fmt.Sprintf("%.1f", e.Level)
	}
	exNoNet := make([]string, len(vs))
	exNet := make([]string, len(vs))
	for i, v := range vs {
		exNoNet[i] = expo(vms[i])
		if v.bare {
			exNet[i] = exNoNet[i]
			continue
		}
		y := build(i, v, true)
		exNet[i] = expo(y)
	}

	med := func(d []time.Duration) float64 {
		if len(d) == 0 {
			return 0
		}
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
		n := len(s)
		if n%2 == 1 {
			return float64(s[n/2]) / 1e6
		}
		return float64(s[n/2-1]+s[n/2]) / 2e6
	}
	accel := "kvm"
	if !kvm {
		accel = "tcg"
	}
	var b strings.Builder
	host, _ := os.Hostname()
	var load []byte
	load, _ = os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "Sandbox start cost, %s, %s, accel %s, %d interleaved reps, loadavg at end %s\n\n", time.Now().UTC().Format(time.RFC3339), host, accel, reps, strings.TrimSpace(string(load)))
	if mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", sandbox.PID1)); err == nil {
		n, sys := 0, 0
		for _, l := range strings.Split(strings.TrimSpace(string(mi)), "\n") {
			n++
			if f := strings.Fields(l); len(f) > 4 && (f[4] == "/sys" || strings.HasPrefix(f[4], "/sys/")) {
				sys++
			}
		}
		fmt.Fprintf(&b, "Mounts in systemd's namespace (what ProtectSystem= and ProtectKernelTunables= remount): %d, %d of them /sys or under it.\n\n", n, sys)
	}
	fmt.Fprintf(&b, "| variant | n | job median ms | job Δ vs full | QMP median ms | QMP Δ vs full | after job ms | exposure (no NIC / user NIC) | fail |\n|---|---|---|---|---|---|---|---|---|\n")
	fj, fq := med(job[1]), med(qmp[1])
	for i, v := range vs {
		j, q := med(job[i]), med(qmp[i])
		aj := make([]time.Duration, len(qmp[i]))
		for k := range qmp[i] {
			aj[k] = qmp[i][k] - job[i][k]
		}
		note := ""
		if fails[i] > 0 {
			note = fmt.Sprintf("%d: %s", fails[i], strings.ReplaceAll(firstErr[i], "|", "/"))
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %+.1f | %.1f | %+.1f | %.1f | %s / %s | %s |\n", v.name, len(job[i]), j, j-fj, q, q-fq, med(aj), exNoNet[i], exNet[i], note)
	}
	t.Log("\n" + b.String())
	if out := os.Getenv("VMSUP_SANDBOX_PERF_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// waitQMP polls the socket every 1 ms until QMP answers query-status.
func waitQMP(ctx context.Context, sock string) error {
	var c net.Conn
	for {
		var err error
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("QMP at %s: %w (last: %v)", sock, ctx.Err(), err)
		case <-time.After(time.Millisecond):
		}
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil { // greeting
		return err
	}
	for _, cmd := range []string{`{"execute":"qmp_capabilities"}`, `{"execute":"query-status"}`} {
		if _, err := c.Write([]byte(cmd + "\n")); err != nil {
			return err
		}
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			if strings.Contains(l, `"return"`) {
				break
			}
			if strings.Contains(l, `"error"`) {
				return errors.New(strings.TrimSpace(l))
			}
		}
	}
	return nil
}

// grantKVM gives uid rw on /dev/kvm through one ACL entry, as vmsup does,
// unless the device already has an ACL (someone else's grant: left alone).
func grantKVM(t *testing.T, uid uint32) {
	const x = "system.posix_acl_access"
	if _, err := unix.Getxattr("/dev/kvm", x, nil); err == nil {
		return
	}
	fi, err := os.Stat("/dev/kvm")
	if err != nil {
		t.Fatal(err)
	}
	mode := uint16(fi.Mode().Perm())
	ents := [][3]uint32{{0x01, uint32(mode >> 6 & 7), 0xffffffff}, {0x02, 6, uid}, {0x04, uint32(mode >> 3 & 7), 0xffffffff}, {0x10, 6 | uint32(mode>>3&7), 0xffffffff}, {0x20, uint32(mode & 7), 0xffffffff}}
	buf := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range ents {
		buf = binary.LittleEndian.AppendUint16(buf, uint16(e[0]))
		buf = binary.LittleEndian.AppendUint16(buf, uint16(e[1]))
		buf = binary.LittleEndian.AppendUint32(buf, e[2])
	}
	if err := unix.Setxattr("/dev/kvm", x, buf, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Removexattr("/dev/kvm", x)
		os.Chmod("/dev/kvm", fi.Mode().Perm())
	})
}
