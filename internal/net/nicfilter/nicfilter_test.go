package nicfilter

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
)

func TestMain(m *testing.M) {
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestApplyReplaceRemove loads a tap's filter into the kernel, reads it
// back with nft (what an operator sees), replaces it and removes it.
func TestApplyReplaceRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (nftables in a network namespace of the test's own)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft (Debian package nftables) not installed: scripts/install-deps.sh installs it")
	}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	f := Filter{Tap: "vmtabc", MAC: mac, IP: net.ParseIP("10.77.0.5"), AntiSpoofing: true,
		Groups: []spec.SecurityGroup{{Name: "web", Rules: []spec.SecurityRule{
			{Direction: "in", Protocol: "tcp", Ports: "8080", CIDR: "10.77.0.0/24"},
			{Direction: "in", Protocol: "udp", Ports: "5000-5010", Action: "deny"},
		}}}}
	if err := Apply(f); err != nil {
		t.Fatal(err)
	}
	out := nft(t, "list", "ruleset")
	for _, want := range []string{
		`table bridge vmsup-as-vmtabc`, `iifname "vmtabc" jump guard`, `ether saddr != 52:54:00:12:34:56 counter`,
		`ether type arp jump arp`, `@nh,112,32 0xa4d0005 accept`, // the ARP sender address
		`udp sport 67 counter`, `@nh,96,32 0xa4d0005 accept`, // the IPv4 source
		`table inet vmsup-sg-vmtabc`, `ip daddr 10.77.0.5 jump to-guest`, `ct state established,related accept`,
		`ip saddr 10.77.0.0/24 tcp dport 8080 accept`, `udp dport 5000-5010 counter`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, out)
		}
	}
	// Replace: no groups, anti-spoofing kept.
	f.Groups = nil
	if err := Apply(f); err != nil {
		t.Fatal(err)
	}
	if tl, _ := ListTables(); len(tl) != 1 || tl[0] != "bridge vmsup-as-vmtabc" {
		t.Fatalf("tables after replace: %v", tl)
	}
	if n, err := Read("vmtabc"); err != nil || n.Tables != 1 {
		t.Fatalf("counters %+v %v", n, err)
	}
	for range 2 { // idempotent
		if err := Remove("vmtabc"); err != nil {
			t.Fatal(err)
		}
	}
	if out := nft(t, "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Fatalf("left after remove:\n%s", out)
	}
	if err := Apply(Filter{Tap: "x", MAC: mac}); err == nil {
		t.Fatal("a filter without an address was accepted")
	}
}

// TestApplyIPv6 loads a dual-stack NIC's filter: IPv6 from its link-local
// and SLAAC addresses only, no router adverts, redirects or DHCPv6
// server, neighbour discovery for its own addresses, and security group
// rules of either family or both.
func TestApplyIPv6(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (nftables in a network namespace of the test's own)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft (Debian package nftables) not installed: scripts/install-deps.sh installs it")
	}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	if ll := LinkLocal(mac).String(); ll != "fe80::5054:ff:fe12:3456" {
		t.Fatalf("LinkLocal = %s", ll)
	}
	f := Filter{Tap: "vmt6", MAC: mac, IP: net.ParseIP("10.77.0.5"), IPv6: net.ParseIP("fd00:77::5054:ff:fe12:3456"), AntiSpoofing: true,
		Groups: []spec.SecurityGroup{{Name: "web", Rules: []spec.SecurityRule{
			{Direction: "in", Protocol: "tcp", Ports: "8080"},                    // both families
			{Direction: "in", Protocol: "icmp", CIDR: "fd00:77::/64"},            // ICMPv6
			{Direction: "out", Protocol: "udp", Ports: "53", CIDR: "10.0.0.0/8"}, // IPv4 only
		}}}}
	if err := Apply(f); err != nil {
		t.Fatal(err)
	}
	defer Remove("vmt6")
	out := nft(t, "list", "ruleset")
	for _, want := range []string{
		`ether type ip6 jump ip6`, `udp sport 547 counter`, `udp dport 546 counter`,
		`icmpv6 type nd-router-advert counter`, `icmpv6 type nd-redirect counter`,
		`icmpv6 type nd-neighbor-solicit jump nd-solicit`, `icmpv6 type nd-neighbor-advert jump nd-advert`,
		// The bridge family prints IPv6 addresses raw: the source (@nh,64,128), an ND target (@th,64,128).
		`@nh,64,128 0xfe80000000000000505400fffe123456 accept`, `@nh,64,128 0xfd00007700000000505400fffe123456 accept`,
		`@nh,64,128 0x0 jump nd-dad`, `@th,64,128 != 0xfe80000000000000505400fffe123456 @th,64,128 != 0xfd00007700000000505400fffe123456 counter`,
		`@nh,32,16 0x20 @th,192,8 0x2 @th,208,48 0x525400123456 accept`, // an NA's target link-layer address: its MAC
		`ip6 daddr fd00:77::5054:ff:fe12:3456 jump to-guest`, `ip6 saddr fe80::5054:ff:fe12:3456 jump from-guest`,
		`meta nfproto ipv6 tcp dport 8080 accept`, `meta nfproto ipv4 tcp dport 8080 accept`,
		`ip6 saddr fd00:77::/64 meta l4proto ipv6-icmp accept`, `ip daddr 10.0.0.0/8 udp dport 53 accept`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nfproto ipv6 udp dport 53") {
		t.Errorf("an IPv4 rule became an IPv6 one:\n%s", out)
	}
	if t.Failed() {
		return
	}
	t.Logf("ruleset:\n%s", out)
}

func nft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("nft", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v\n%s", args, err, out)
	}
	return string(out)
}
