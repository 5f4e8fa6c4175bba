package netmanage_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// labPrefix6 is the lab network's IPv6 /64: the ULA made from its name
// (its file names none).
func labPrefix6() string {
	_, p, _ := net.ParseCIDR(netmanage.ULA(labNet))
	return p.String()
}

// labGW6 is the host's IPv6 address on the lab network.
func labGW6() string {
	ip, _, _ := net.ParseCIDR(netmanage.ULA(labNet))
	return ip.String()
}

// ipv6Names: each guest got by router advert the SLAAC address vmsup
// gave its NIC (checked in boot: status shows it), resolves the other's
// AAAA name and pings the address it got; DHCPv6 (the network's mode is
// "both") leases vma the same address.
func ipv6Names(t *testing.T, ctx context.Context, a, b *guest) {
	for _, g := range []*guest{a, b} {
		mac, _ := net.ParseMAC(g.mac)
		nw := netmanage.Network{Name: labNet}
		if want := nw.GuestIPv6(mac).String(); g.ip6 != want {
			t.Fatalf("%s has %s by SLAAC, want %s (its MAC in %s)", g.name, g.ip6, want, labPrefix6())
		}
	}
	for _, p := range [][2]*guest{{a, b}, {b, a}} {
		g, other := p[0], p[1]
		out := g.run(t, ctx, "nslookup -type=aaaa "+other.name)
		if !strings.Contains(out, "Address: "+other.ip6) {
			t.Fatalf("%s: nslookup -type=aaaa %s:\n%s", g.name, other.name, out)
		}
		g.run(t, ctx, "ping6 -c 1 -W 5 "+other.ip6)
	}
	a.run(t, ctx, "ping6 -c 1 -W 5 "+labGW6())
	if out := strings.TrimSpace(a.run(t, ctx, "vmsup-nettool dhcp6 eth0")); out != a.ip6 {
		t.Fatalf("vma: DHCPv6 leased %q, want %s", out, a.ip6)
	}
}

// nat66: vma reaches the outside host over IPv6, which sees the uplink's
// address (NAT66), having no route to the lab's prefix.
func nat66(t *testing.T, ctx context.Context, a *guest) {
	a.run(t, ctx, "ping6 -c 1 -W 5 "+outsideIP6)
	if out := a.run(t, ctx, fmt.Sprintf("echo hi | nc -w 5 %s %d", outsideIP6, outsidePort)); !strings.Contains(out, "outside") {
		t.Fatalf("vma: nc to the outside host over IPv6: %q", out)
	}
	select {
	case from := <-seen:
		if from != uplinkHost6 {
			t.Fatalf("the outside host saw %s, want the uplink's %s (NAT66)", from, uplinkHost6)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the outside host saw no connection")
	}
}

// antiSpoofing6: vma sends IPv6 from an address not its own (crafted
// frames and through its kernel), a neighbour advert for vmb's address,
// a router advert and a DHCPv6 server's reply; neither vmb (what its tap
// hands it) nor the host (what reaches the bridge) sees any of it, vmb
// takes no address from the advert, vma's own IPv6 passes before and
// after, and status counts the drops.
func antiSpoofing6(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, a, b *guest) {
	toB, toHost := sniff(t, b.tap), sniff(t, "vmsn-"+labNet)
	aMAC, _ := net.ParseMAC(a.mac)
	fromA := func(bb []byte) bool { return slices.Equal(srcMAC(bb), aMAC) }
	is := func(ip net.IP, want string) bool { return ip != nil && ip.Equal(net.ParseIP(want)) }
	seen := func(what string, match func([]byte) bool) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		nb, nh := toB.count(true, match), toHost.count(false, match)
		if nb > 0 || nh > 0 {
			t.Errorf("%s: vmb got %d frames, the host %d; want none", what, nb, nh)
		}
	}
	before := spoofDrops(t, ctx, sup, "vma")
	// Control: vma's own IPv6 reaches both.
	a.run(t, ctx, "ping6 -c 1 -W 3 "+b.ip6+" && ping6 -c 1 -W 3 "+labGW6())
	time.Sleep(300 * time.Millisecond)
	own := func(bb []byte) bool { return is(ipv6Src(bb), a.ip6) }
	if toB.count(true, own) == 0 || toHost.count(false, own) == 0 {
		t.Fatalf("the sniffers saw nothing of vma's own ping6")
	}

	other := strings.TrimSuffix(labPrefix6(), "/64") + "99"
	a.run(t, ctx, fmt.Sprintf("vmsup-nettool echo eth0 %s %s %s && vmsup-nettool echo eth0 %s %s %s",
		other, b.ip6, b.mac, other, labGW6(), hostMAC(t)))
	// Through its kernel too (busybox's ip has no nodad: DAD off instead).
	a.run(t, ctx, fmt.Sprintf("echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad && ip -6 addr add %s/64 dev eth0", other))
	a.sh.Run(ctx, fmt.Sprintf("ping6 -c 2 -W 1 -I %s %s; ping6 -c 2 -W 1 -I %s %s", other, b.ip6, other, labGW6()))
	a.run(t, ctx, fmt.Sprintf("ip -6 addr del %s/64 dev eth0; echo 1 >/proc/sys/net/ipv6/conf/eth0/accept_dad", other))
	seen("another IPv6 source", func(bb []byte) bool { return is(ipv6Src(bb), other) })

	a.run(t, ctx, "vmsup-nettool na eth0 "+b.ip6)
	seen("a neighbour advert for vmb's address", func(bb []byte) bool { return fromA(bb) && is(ndTarget(bb), b.ip6) })

	a.run(t, ctx, "vmsup-nettool ra eth0 2001:db8:bad::/64")
	seen("a router advert", func(bb []byte) bool { return fromA(bb) && icmp6Type(bb) == 134 })
	if out := b.run(t, ctx, "sleep 1; ip -6 addr show dev eth0; ip -6 route"); strings.Contains(out, "2001:db8:bad") {
		t.Errorf("vmb took the rogue advert's prefix:\n%s", out)
	}

	a.run(t, ctx, "vmsup-nettool dhcp6-reply eth0")
	seen("a DHCPv6 server's reply", func(bb []byte) bool { return fromA(bb) && udp6SrcPort(bb) == 547 })

	a.run(t, ctx, "ping6 -c 1 -W 3 "+b.ip6) // vma is fine again
	// 3 frames each: echo to vmb and to the host, the advert, the router
	// advert, the DHCPv6 reply (and what vma's kernel sent as "other").
	after := spoofDrops(t, ctx, sup, "vma")
	if after-before < 15 {
		t.Errorf("status counted %d dropped (%d -> %d), want at least 15", after-before, before, after)
	}
	out, err := cli(ctx, sup, "status", "vma")
	if err != nil || !strings.Contains(out, fmt.Sprintf("dropped spoofed %d ", after)) {
		t.Errorf("vmsup status vma: %v\n%s", err, out)
	}
	t.Logf("vma's anti-spoofing dropped %d IPv6 packets; status: %s", after-before, grepLine(out, "nic:"))
}

// spoofDrops is what the VM's NIC's anti-spoofing dropped, as status says.
func spoofDrops(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string) uint64 {
	t.Helper()
	st, err := sup.Status(ctx, vm)
	if err != nil || len(st.NICs) != 1 || st.NICs[0].Dropped == nil {
		t.Fatalf("status of %s: %+v %v", vm, st.NICs, err)
	}
	return st.NICs[0].Dropped.Spoofed
}

// TestManagedNetworkDHCPv6Routed: a network with its own prefix, IPv6 by
// DHCPv6 only and routed rather than NAT66: its guest's one global
// address is its DHCPv6 lease (the adverts carry the M flag and no
// prefix for SLAAC), the address vmsup gave its NIC, resolvable by its
// AAAA name; the outside host, routing the prefix to the uplink, sees
// the guest's own address; there is no NAT66 table.
func TestManagedNetworkDHCPv6Routed(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	sup := supervisortest.New(t, env, "", vmsupBin)
	dir := t.TempDir()
	const name, prefix = "lab6", "fd00:79::/64"
	def := filepath.Join(dir, name+".toml")
	os.WriteFile(def, []byte(fmt.Sprintf("name = %q\nipv4 = \"10.79.0.1/24\"\nipv6 = \"fd00:79::1/64\"\nipv6_mode = \"dhcpv6\"\nnat6 = false\n", name)), 0o644)
	if out, err := cli(ctx, sup, "network", "create", def); err != nil || !strings.Contains(out, "fd00:79::1/64 (dhcpv6)") {
		t.Fatalf("network create: %v\n%s", err, out)
	}
	t.Cleanup(func() { cli(context.Background(), sup, "network", "rm", name) })
	_, dst, _ := net.ParseCIDR(prefix)
	route := &netlink.Route{Dst: dst, Gw: net.ParseIP(uplinkHost6)}
	if err := netsetup.InNetns(outside, func() error { return netlink.RouteAdd(route) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netsetup.InNetns(outside, func() error { return netlink.RouteDel(route) }) })

	f := vmFileOn(t, dir, "vmc", name, "vmsup.dhcp vmsup.dhcp6 vmsup.ipv6", "", "")
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "vmc") })
	g := boot(t, ctx, sup, f)
	mac, _ := net.ParseMAC(g.mac)
	want := (&netmanage.Network{Name: name, IPv6: "fd00:79::1/64"}).GuestIPv6(mac).String()
	if out := g.run(t, ctx, "ip -6 -o addr show dev eth0 scope global"); g.ip6 != want || strings.Count(out, "inet6") != 1 || !strings.Contains(out, want+"/128") {
		t.Fatalf("vmc's global addresses, want only its DHCPv6 lease %s/128:\n%s", want, out)
	}
	if out := g.run(t, ctx, "nslookup -type=aaaa vmc"); !strings.Contains(out, "Address: "+want) {
		t.Fatalf("nslookup -type=aaaa vmc:\n%s", out)
	}
	if out := g.run(t, ctx, fmt.Sprintf("echo hi | nc -w 5 %s %d", outsideIP6, outsidePort)); !strings.Contains(out, "outside") {
		t.Fatalf("vmc: nc to the outside host over IPv6: %q", out)
	}
	select {
	case from := <-seen:
		if from != want {
			t.Fatalf("the outside host saw %s, want vmc's own %s (routed)", from, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the outside host saw no connection")
	}
	if tl := vmsupTables(t); slices.Contains(tl, "ip6 vmsup-nat6-"+name) || !slices.Contains(tl, "ip vmsup-nat-"+name) {
		t.Fatalf("tables %v: want IPv4 NAT and no NAT66 for %s", tl, name)
	}
}
