package netmanage_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/supervisor"
)

// The world of the guest tests, all in the test binary's own network
// namespace: the managed network "lab", an uplink veth whose other end is
// in the namespace "outside" (a host that has no route to the lab's
// subnet: only NAT reaches it).
const (
	labNet      = "lab"
	labGW       = "10.77.0.1"
	uplink      = "vmsup-up0"
	uplinkHost  = "192.168.200.1"
	outsideIP   = "192.168.200.2"
	outsidePort = 7000
	// The uplink's IPv6 network: the outside host has no route to the
	// lab's prefix either, only NAT66 reaches it.
	uplinkHost6 = "fd00:200::1"
	outsideIP6  = "fd00:200::2"
)

var (
	env      *testenv.Env
	vmsupBin string
	outside  string // the outside namespace's path
	// seen receives the peer address of every connection to the outside
	// host's listener.
	seen = make(chan string, 16)
)

func TestMain(m *testing.M) {
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("managed-network tests need root (namespaces, nftables, systemd sandbox, QEMU); skipping all")
		return 0
	}
	for _, bin := range []string{"dnsmasq", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			fmt.Printf("%s not installed (Debian packages dnsmasq-base, nftables: scripts/install-deps.sh); skipping all\n", bin)
			return 0
		}
	}
	dir, err := os.MkdirTemp("", "vmsup-netmanage-")
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
	// Deleted before dir goes: a namespace left mounted there outlived
	// the run (and os.RemoveAll could not remove its mount point).
	defer netsetup.NamedNetns{Dir: filepath.Join(dir, "netns")}.Delete(context.Background(), "outside")
	if err := outsideHost(ctx, dir); err != nil {
		fmt.Println("outside host:", err)
		return 1
	}
	env, err = testenv.Start(ctx, filepath.Join(dir, "env"))
	if err != nil {
		fmt.Println("test environment:", err)
		return 1
	}
	defer env.Close()
	return m.Run()
}

// outsideHost makes the uplink: a veth pair with uplinkHost here and
// outsideIP in a namespace of its own, where a TCP listener reports who
// connects.
func outsideHost(ctx context.Context, dir string) error {
	nsm := netsetup.NamedNetns{Dir: filepath.Join(dir, "netns")}
	p, err := nsm.Create(ctx, "outside")
	if err != nil {
		return err
	}
	outside = p.Host
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: uplink}, PeerName: "vmsup-out0"}
	if err := netlink.LinkAdd(veth); err != nil {
		return err
	}
	if err := addrUp(uplink, uplinkHost+"/24", uplinkHost6+"/64"); err != nil {
		return err
	}
	peer, err := netlink.LinkByName("vmsup-out0")
	if err != nil {
		return err
	}
	f, err := os.Open(outside)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := netlink.LinkSetNsFd(peer, int(f.Fd())); err != nil {
		return err
	}
	return netsetup.InNetns(outside, func() error {
		if err := addrUp("vmsup-out0", outsideIP+"/24", outsideIP6+"/64"); err != nil {
			return err
		}
		for _, ip := range []string{outsideIP, outsideIP6} {
			l, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(outsidePort)))
			if err != nil {
				return err
			}
			go answer(l)
		}
		return nil
	})
}

// answer says "outside" to each connection and reports who connected.
func answer(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		fmt.Fprintln(c, "outside")
		c.Close()
		select {
		case seen <- host:
		default:
		}
	}
}

// addrUp gives link its addresses (IPv6 ones without duplicate address
// detection, so they can be bound at once) and brings it up.
func addrUp(link string, cidrs ...string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	for _, cidr := range cidrs {
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		if a.IP.To4() == nil {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("%s: %w", link, err)
		}
	}
	return netlink.LinkSetUp(l)
}

// cli runs the vmsup CLI against sup's root and the sandbox.
func cli(ctx context.Context, sup *supervisor.Supervisor, args ...string) (string, error) {
	full := append([]string{"--root", sup.Root(), "--systemd-bus", env.Systemd.BusAddress}, args...)
	out, err := exec.CommandContext(ctx, vmsupBin, full...).CombinedOutput()
	return string(out), err
}

// lookup asks the lab's dnsmasq for name's IPv4 addresses.
func lookup(ctx context.Context, name string) ([]string, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", labGW+":53")
	}}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return r.LookupHost(cctx, name)
}

// vmsupTables lists vmsup's nftables tables in the test's namespace.
func vmsupTables(t testing.TB) []string {
	t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v\n%s", err, out)
	}
	var vt []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "vmsup-") {
			vt = append(vt, strings.TrimPrefix(strings.TrimSpace(l), "table "))
		}
	}
	return vt
}
