package units_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// TestProfileCoversQEMU: every file a real QEMU opens (under strace)
// while it starts a test guest with a user-mode NIC, boots it, and
// forwards the guest's DNS query, the VM's profile allows. On a real host
// with AppArmor enforcing (issue 48) QEMU was denied
// /sys/devices/system/node/ at every start (libnuma lists it) and
// /etc/resolv.conf with a user NIC (slirp reads it for the guest's DNS).
func TestProfileCoversQEMU(t *testing.T) {
	qemu, straceBin := lookPath(t, "qemu-system-x86_64"), lookPath(t, "strace")
	const incDir = "/etc/apparmor.d"
	if _, err := os.Stat(filepath.Join(incDir, "abstractions/base")); err != nil {
		t.Skipf("AppArmor's abstractions are not installed (apt-get install apparmor): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	g, err := testenv.Guest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vmsup-aa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f, err := spec.Parse(filepath.Join(dir, "aa.toml"), []byte(fmt.Sprintf(`name = "aa"
memory = "256M"
accel = "tcg"
[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.dhcp"
[[nic]]
name = "lan"
`, g.Kernel, g.Initrd)))
	if err != nil {
		t.Fatal(err)
	}
	o := qemuargs.Options{Binary: qemu, Accel: spec.AccelTCG, QMPSocket: dir + "/qmp.sock", EventSocket: dir + "/events.sock",
		ConsoleSocket: dir + "/console.sock", ConsoleLog: dir + "/console.log", AgentSocket: dir + "/agent.sock"}
	argv, err := qemuargs.Build(&f.VM, o)
	if err != nil {
		t.Fatal(err)
	}
	// The profile vmsup loads for this VM (internal/lifecycle/confine): its state
	// directory and boot files on top of the base rules.
	prof := units.Profile{Name: "vmsup-aa", Binary: qemu, Network: true, Rules: []units.PathRule{
		{Path: dir + "/", Mode: "rwk"}, {Path: g.Kernel, Mode: "r"}, {Path: g.Initrd, Mode: "r"}}}
	text, err := prof.Render()
	if err != nil {
		t.Fatal(err)
	}
	policy := loadAAPolicy(t, string(text), incDir)

	trace := filepath.Join(dir, "trace")
	cmd := exec.CommandContext(ctx, straceBin, append([]string{"-f", "-ff", "-qq", "-e", "trace=open,openat",
		"-e", "status=successful", "-o", trace}, argv...)...)
	if out, err := os.Create(filepath.Join(dir, "qemu.out")); err == nil {
		cmd.Stdout, cmd.Stderr = out, out
		defer out.Close()
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	testenv.WaitLog(t, o.ConsoleLog, testenv.NetReadyPrefix, 3*time.Minute)
	testenv.WaitLog(t, o.ConsoleLog, testenv.ShellMarker, time.Minute)
	sh, err := testenv.DialConsole(ctx, o.ConsoleSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	// 10.0.2.3 is slirp's DNS: it reads the host's resolv.conf to forward
	// the query (an answer needs no network here).
	if out, _, err := sh.Run(ctx, "timeout 10 nslookup vmsup.example 10.0.2.3 >/dev/null 2>&1; true"); err != nil {
		t.Fatalf("nslookup in the guest: %v\n%s", err, out)
	}
	quitQEMU(t, o.QMPSocket)
	if err := cmd.Wait(); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "qemu.out"))
		t.Fatalf("strace/QEMU: %v\n%s", err, b)
	}

	opens := tracedOpens(t, trace)
	var denied []string
	for _, op := range opens {
		if ok, why := policy.allows(op.path, op.perms); !ok {
			denied = append(denied, fmt.Sprintf("%s %s (%s)", op.path, op.perms, why))
		}
	}
	slices.Sort(denied)
	for _, d := range slices.Compact(denied) {
		t.Errorf("the profile denies QEMU %s", d)
	}
	resolv, _ := filepath.EvalSymlinks("/etc/resolv.conf")
	for _, want := range []string{"/sys/devices/system/node/", resolv} {
		if !slices.ContainsFunc(opens, func(o tracedOpen) bool { return o.path == want }) {
			t.Errorf("QEMU did not open %s: the test no longer shows what it is about", want)
		}
	}
	t.Logf("%d opens by QEMU checked against profile %s", len(opens), prof.Name)
}

func lookPath(t *testing.T, bin string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		t.Skipf("%s is not installed: %v", bin, err)
	}
	return p
}

// quitQEMU asks QEMU on its QMP socket to quit.
func quitQEMU(t *testing.T, sock string) {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	r.ReadString('\n') // the greeting
	fmt.Fprint(c, `{"execute":"qmp_capabilities"}`+"\n")
	r.ReadString('\n')
	fmt.Fprint(c, `{"execute":"quit"}`+"\n")
	r.ReadString('\n')
}

// tracedOpen is a file QEMU opened, as AppArmor names it (symlinks
// resolved, /proc/self as /proc/PID, a directory with a trailing "/"),
// and what it opened it for.
type tracedOpen struct{ path, perms string }

// tracedOpens reads strace's logs (one a thread: trace.TID).
func tracedOpens(t *testing.T, trace string) []tracedOpen {
	t.Helper()
	logs, _ := filepath.Glob(trace + ".*")
	if len(logs) == 0 {
		t.Fatalf("no strace logs %s.*", trace)
	}
	call := regexp.MustCompile(`^open(?:at)?\((?:AT_FDCWD, )?"([^"]*)", ([A-Z_|]+)`)
	var out []tracedOpen
	for _, l := range logs {
		pid := strings.TrimPrefix(filepath.Ext(l), ".")
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			m := call.FindStringSubmatch(line)
			if m == nil || !filepath.IsAbs(m[1]) || strings.Contains(m[2], "O_PATH") {
				continue
			}
			path := filepath.Clean(m[1])
			if rest, ok := strings.CutPrefix(path, "/proc/self/"); ok {
				path = "/proc/" + pid + "/" + rest
			} else if p, err := filepath.EvalSymlinks(path); err == nil {
				path = p
			}
			if strings.Contains(m[2], "O_DIRECTORY") {
				path += "/"
			}
			perms := "r"
			switch {
			case strings.Contains(m[2], "O_RDWR"):
				perms = "rw"
			case strings.Contains(m[2], "O_WRONLY"):
				perms = "w"
			}
			out = append(out, tracedOpen{path, perms})
		}
	}
	return out
}
