package remotetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// The tests' shared guest and CLI; each test's API host is a systemd
// sandbox in a network namespace of its own (startHost).
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	// The LAN between the client's namespace and the host's lives in a
	// namespace of the test's own.
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	}))
}

// idleExit is the server's idle_exit in these tests.
const idleExit = 2 * time.Second

// host is an API host: a systemd sandbox in its own network namespace,
// reached over a veth from the test's, with vmsup-api.socket installed.
type host struct {
	sd                 *testenv.Systemd
	root, dir, addr    string
	url, sock          string
	pki                *PKI
	certs              map[string][2]string // client name -> cert, key
	rogueCert, rogueCA string
	rogueKey           string
}

func startHost(t *testing.T) *host {
	t.Helper()
	testenv.SkipUnlessRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sdDir, err := os.MkdirTemp("", "vmsup-ra-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sdDir) })
	sd, err := testenv.StartSystemdHost(ctx, sdDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sd.Stop() })
	lan, err := testenv.NewLAN("vmsrabr0", fmt.Sprintf("10.97.%d.", os.Getpid()%250+1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lan.Close() })
	h := &host{sd: sd, root: t.TempDir(), dir: t.TempDir(), certs: map[string][2]string{}}
	if h.addr, err = lan.Join(sd, 10); err != nil {
		t.Fatal(err)
	}
	h.url = "https://" + net.JoinHostPort(h.addr, "8443")
	h.sock = filepath.Join(sd.RunDir, "vmsup-api.sock") // /run/vmsup-api.sock inside
	h.makeCerts(t)
	h.install(t, ctx)
	return h
}

// makeCerts makes the CA, the server's certificate, the clients' and a
// rogue CA's client.
func (h *host) makeCerts(t *testing.T) {
	var err error
	if h.pki, err = NewPKI(h.dir, "vmsup"); err != nil {
		t.Fatal(err)
	}
	for _, cn := range []string{"admin", "viewer", "operator", "webop"} {
		c, k, err := h.pki.Issue(cn)
		if err != nil {
			t.Fatal(err)
		}
		h.certs[cn] = [2]string{c, k}
	}
	rogueDir := t.TempDir()
	rogue, err := NewPKI(rogueDir, "rogue")
	if err != nil {
		t.Fatal(err)
	}
	if h.rogueCert, h.rogueKey, err = rogue.Issue("admin"); err != nil { // the right name, the wrong CA
		t.Fatal(err)
	}
	h.rogueCA = rogue.CAFile
}

// install writes the server's config and units and starts the socket.
func (h *host) install(t *testing.T, ctx context.Context) {
	srvCert, srvKey, err := h.pki.Issue("server", net.ParseIP(h.addr))
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(h.dir, "remote.toml")
	body := fmt.Sprintf(`ca = %q
cert = %q
key = %q
idle_exit = %q
max_calls_per_client = 4

[[grant]]
identity = "cn:admin"
role = "admin"
vms = ["*"]

[[grant]]
identity = "cn:viewer"
role = "read-only"
vms = ["*"]

[[grant]]
identity = "cn:operator"
role = "operator"
vms = ["r*"]

[[grant]]
identity = "cn:webop"
role = "operator"
vms = ["web*"]

[[grant]]
identity = "uid:0"
role = "read-only"
vms = ["*"]
`, h.pki.CAFile, srvCert, srvKey, idleExit)
	if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	envs := append([]string{"VMSUP_ROOT=" + h.root, "VMSUP_UNIT_DIR=" + filepath.Join(h.root, "etc-systemd"),
		"VMSUP_BOOT_TARGET=" + testenv.BootTarget, "VMSUP_RUN_DIR=" + filepath.Join(h.root, "run")}, env.CLIEnv()...)
	sock, svc, err := remoteapi.Units(remoteapi.UnitOptions{Self: vmsupBin, Config: config, Listen: net.JoinHostPort(h.addr, "8443"),
		Socket: "/run/vmsup-api.sock", Environment: envs})
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{remoteapi.SocketUnit: sock, remoteapi.ServiceUnit: svc} {
		if err := os.WriteFile(filepath.Join(h.sd.UnitDir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"daemon-reload"}, {"start", remoteapi.SocketUnit}} {
		if out, err := h.sd.Systemctl(ctx, args...); err != nil {
			t.Fatalf("systemctl %v: %v %s", args, err, out)
		}
	}
}

type result struct {
	stdout, stderr string
	code           int
}

// run runs the CLI with extra environment.
func run(t testing.TB, extra []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, vmsupBin, args...)
	cmd.Env = append(os.Environ(), extra...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	r := result{stdout: o.String(), stderr: e.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("vmsup %v: %v", args, err)
	}
	return r
}

// localEnv is the environment of the CLI run on the host itself.
func (h *host) localEnv() []string {
	return append([]string{"VMSUP_ROOT=" + h.root, "VMSUP_SYSTEMD_BUS=" + h.sd.BusAddress, "VMSUP_JOURNAL_DIR=" + h.sd.JournalDir,
		"VMSUP_UNIT_DIR=" + filepath.Join(h.root, "etc-systemd"), "VMSUP_BOOT_TARGET=" + testenv.BootTarget,
		"VMSUP_RUN_DIR=" + filepath.Join(h.root, "run"),
		// systemd-analyze (status's exposure figure) where the server's runs.
		fmt.Sprintf("VMSUP_SYSTEMD_ANALYZE=nsenter -t %d -m -p systemd-analyze", h.sd.PID1)}, env.CLIEnv()...)
}

// remoteArgs are the flags of a remote CLI run as client who.
func (h *host) remoteArgs(who string) []string {
	c := h.certs[who]
	return []string{"--remote", h.url, "--ca", h.pki.CAFile, "--cert", c[0], "--key", c[1]}
}

// local runs the CLI on the host.
func (h *host) local(t testing.TB, args ...string) result {
	t.Helper()
	return run(t, h.localEnv(), args...)
}

// remote runs the CLI from the client's namespace against the API, as who,
// with no host environment at all.
func (h *host) remote(t testing.TB, who string, args ...string) result {
	t.Helper()
	return run(t, []string{"VMSUP_ROOT=/nonexistent", "VMSUP_SYSTEMD_BUS=unix:path=/nonexistent"}, append(h.remoteArgs(who), args...)...)
}

// guestTOML is a test VM's file; its [display] gives it a VNC server.
func guestTOML(name string) string {
	return fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
stop_timeout = "20s"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"

[display]
`, name, env.Guest.Kernel, env.Guest.Initrd)
}

func (h *host) writeVM(t testing.TB, name, body string) string {
	p := filepath.Join(h.dir, name+".toml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// vmsupProcs are the vmsup processes running on the machine other than the
// console-log hooks beside each QEMU: "api serve", or a CLI.
func vmsupProcs() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || exe != vmsupBin {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if len(b) == 0 {
			continue // exiting (its memory is gone): a console-log hook that just ended, typically
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) > 1 && argv[1] == supervisor.HookConsoleLog {
			continue
		}
		out = append(out, e.Name()+": "+strings.Join(argv, " "))
	}
	return out
}

// waitNoServer waits for the API server to exit after the last call and
// samples the process list for a second after: nothing may run. It returns
// how long the server lived on after the call.
func waitNoServer(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	for len(vmsupProcs()) > 0 {
		if time.Since(start) > idleExit+15*time.Second {
			t.Fatalf("vmsup processes %s after the last call: %v", time.Since(start), vmsupProcs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	gone := time.Since(start)
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		if p := vmsupProcs(); len(p) > 0 {
			t.Fatalf("a vmsup process between calls: %v", p)
		}
	}
	return gone
}

// volatile are the parts of an output that change from one call to the
// next: uptimes, memory use, agent round trips, durations, ages.
var volatile = []*regexp.Regexp{
	regexp.MustCompile(`\(up [0-9dhms]+\)`),
	regexp.MustCompile(`(?m)^rss: .*$`),
	regexp.MustCompile(`responding in [0-9.]+ ms`),
	regexp.MustCompile(`[0-9]+(\.[0-9]+)?(ms|s|µs)\b`),
	regexp.MustCompile(`"(uptime_seconds|memory_used_bytes|ping_ms)": [0-9.]+`),
	regexp.MustCompile(`  +[0-9]+[dhms][0-9]*[hms]?  `),
}

// pidNamespaced are the lines only a reader in the sandbox's PID namespace
// can fill: the server runs there (socket-activated by the sandbox's
// systemd), the local CLI of the test does not and cannot read QEMU's
// /proc entry (on a real host both do).
var pidNamespaced = regexp.MustCompile(`(?m)^ *"seccomp_filters": [0-9]+,\n`)

// norm is out with the VM name from replaced by to and volatile parts
// masked.
func norm(out, from, to string) string {
	if from != "" {
		out = regexp.MustCompile(`\b`+from+`\b`).ReplaceAllString(out, to)
	}
	out = pidNamespaced.ReplaceAllString(out, "")
	for _, re := range volatile {
		out = re.ReplaceAllString(out, "<v>")
	}
	// A table's columns are as wide as their widest cell: an uptime of
	// 59s in one call and 1m0s in the next widens its column by one.
	return padding.ReplaceAllString(out, "  ")
}

var padding = regexp.MustCompile(`  +`)
