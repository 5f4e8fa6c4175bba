package networktest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// The networks every test shares, all in the test's own namespace: a Linux
// bridge, an OVS bridge and a CNI bridge network, each with the host side's
// address.
const (
	linuxBridge = "vmsbr0"
	linuxHost   = "10.88.0.1"
	ovsBridge   = "vmsovs0"
	ovsHost     = "10.89.0.1"
	cniBridge   = "vmscni0"
	cniHost     = "10.90.0.1"
	cniSubnet   = "10.90.0.0/24"
)

var (
	env      *testenv.Env
	ovs      *testenv.OVS
	vmsupBin string
	cniConf  string // the conflist
	ipamDir  string // host-local's leases
)

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "-fault-helper" {
		// A command killed mid-way (supervisortest.RunJob), in the test's
		// namespace already.
		os.Exit(supervisortest.FaultHelper(os.Args[2]))
	}
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("network tests need root (namespaces, systemd sandbox, QEMU); skipping all")
		return 0
	}
	dir, err := os.MkdirTemp("", "vmsup-net-")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if vmsupBin, err = testenv.BuildVmsup(ctx, dir); err != nil {
		fmt.Println(err)
		return 1
	}
	if err := hostNetworks(ctx, dir); err != nil {
		fmt.Println("networks:", err)
		return 1
	}
	defer ovs.Stop()
	env, err = testenv.Start(ctx, filepath.Join(dir, "env"))
	if err != nil {
		fmt.Println("test environment:", err)
		return 1
	}
	defer env.Close()
	return m.Run()
}

// hostNetworks makes the Linux bridge, starts OVS with its bridge, and
// writes the CNI network config.
func hostNetworks(ctx context.Context, dir string) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: linuxBridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return err
	}
	if err := addrUp(linuxBridge, linuxHost+"/24"); err != nil {
		return err
	}
	var err error
	if ovs, err = testenv.StartOVS(ctx, filepath.Join(dir, "ovs")); err != nil {
		return err
	}
	if err := ovs.AddBridge(ctx, ovsBridge); err != nil {
		return err
	}
	if err := addrUp(ovsBridge, ovsHost+"/24"); err != nil {
		return err
	}
	ipamDir = filepath.Join(dir, "ipam")
	cniConf = filepath.Join(dir, "vmsup-test.conflist")
	return os.WriteFile(cniConf, []byte(fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "vmsup-test",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q, "gateway": %q}]]}
  }]
}`, cniBridge, ipamDir, cniSubnet, cniHost)), 0o644)
}

func addrUp(link, cidr string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("%s: %w", link, err)
	}
	return netlink.LinkSetUp(l)
}

// newSup returns a Supervisor wired to the sandbox, the test OVS and the
// sandbox's namespaces.
func newSup(t testing.TB) *supervisor.Supervisor {
	s, _ := newSupLog(t)
	return s
}

// newSupLog is newSup with the Supervisor's log (info and up) kept.
func newSupLog(t testing.TB) (*supervisor.Supervisor, *syncBuffer) {
	t.Helper()
	log := &syncBuffer{}
	s, err := supervisor.New(supervisor.Options{
		Logger:     slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Root:       t.TempDir(),
		SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps,
		JournalDir: env.Systemd.JournalDir,
		Self:       vmsupBin,
		AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs,
		Network: supervisor.NetworkOptions{
			OVSDB: ovs.DB,
			Netns: testenv.SandboxNetns{Systemd: env.Systemd},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, log
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// guestFile writes a VM booting the test guest with cmdline words and
// extra TOML (NICs), and parses it.
func guestFile(t testing.TB, name, cmdline, extra string) *spec.File {
	t.Helper()
	if !strings.Contains(extra, "stop_timeout") {
		extra = "stop_timeout = \"20s\"\n" + extra
	}
	// Top-level keys first, then tables.
	top, tables, _ := strings.Cut(extra, "[[")
	if tables != "" {
		tables = "[[" + tables
	}
	body := fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
hotplug_slots = 2
%s
[boot]
kernel = %q
initrd = %q
cmdline = %q

%s`, name, top, env.Guest.Kernel, env.Guest.Initrd, "console=ttyS0 no_timer_check "+cmdline, tables)
	return supervisortest.LoadTOML(t, t.TempDir(), name, body)
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitConsole waits until the VM's console log contains marker.
func waitConsole(t testing.TB, st supervisor.Status, marker string, d time.Duration) {
	t.Helper()
	testenv.WaitLog(t, st.ConsoleLog, marker, d)
}

// shell waits for the guest's shell and connects to it.
func shell(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, name string) *testenv.GuestShell {
	t.Helper()
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	waitConsole(t, st, "VMSUP-SHELL-READY", 120*time.Second)
	g, err := testenv.DialConsole(ctx, st.Console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	// Keep kernel messages (hotplug) off the console the commands run on.
	if _, _, err := g.Run(ctx, "dmesg -n 1"); err != nil {
		t.Fatal(err)
	}
	return g
}

// guestRun runs cmd in the guest and fails the test unless it exits 0.
func guestRun(t testing.TB, ctx context.Context, g *testenv.GuestShell, cmd string) string {
	t.Helper()
	out, code, err := g.Run(ctx, cmd)
	if err != nil || code != 0 {
		t.Fatalf("guest: %s: exit %d, %v\n%s", cmd, code, err, out)
	}
	return out
}

// hostPing pings addr from the test's namespace (the host side) with
// busybox (busybox-static, which the guest build installs anyway).
func hostPing(t testing.TB, ctx context.Context, addr string) {
	t.Helper()
	var out []byte
	var err error
	for range 5 { // the first packets may go to ARP
		out, err = exec.CommandContext(ctx, "busybox", "ping", "-c", "1", "-W", "2", addr).CombinedOutput()
		if err == nil {
			return
		}
	}
	t.Fatalf("host: ping %s: %v\n%s", addr, err, out)
}

// links lists the links in the test's namespace.
func links(t testing.TB) map[string]bool {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, l := range ls {
		m[l.Attrs().Name] = true
	}
	return m
}

// leases counts host-local's lease files (one per address in use).
func leases(t testing.TB) int {
	n := 0
	filepath.Walk(ipamDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && net.ParseIP(filepath.Base(p)) != nil {
			n++
		}
		return nil
	})
	return n
}

func ovsPorts(t testing.TB, ctx context.Context) []string {
	t.Helper()
	out, err := ovs.VsctlOutput(ctx, "list-ports", ovsBridge)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(out)
}

func sandboxNetns(t testing.TB) []string {
	t.Helper()
	l, err := testenv.SandboxNetns{Systemd: env.Systemd}.List()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// vmsup runs the CLI against sup's root, the sandbox and the test OVS, and
// fails the test if it fails.
func vmsup(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, args ...string) string {
	t.Helper()
	out, err := vmsupErr(ctx, sup, args...)
	if err != nil {
		t.Fatalf("vmsup %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func vmsupErr(ctx context.Context, sup *supervisor.Supervisor, args ...string) (string, error) {
	full := append([]string{"--root", sup.Root(), "--systemd-bus", env.Systemd.BusAddress, "--ovsdb", ovs.DB}, args...)
	out, err := exec.CommandContext(ctx, vmsupBin, full...).CombinedOutput()
	return string(out), err
}
