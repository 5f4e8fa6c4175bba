package netmanage_test

import (
	"net"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/net/netmanage"
)

// TestParseIPv6: a network is dual stack by default, on a ULA /64 made
// from its name (the same on every run and host, another for another
// name); ipv6, ipv6_mode and nat6 are checked naming the key; a guest's
// address is its MAC's SLAAC address in the prefix.
func TestParseIPv6(t *testing.T) {
	parse := func(body string) (*netmanage.Network, error) {
		return netmanage.Parse("lab.toml", []byte("name = \"lab\"\nipv4 = \"10.77.0.1/24\"\n"+body))
	}
	n, err := parse("")
	if err != nil {
		t.Fatal(err)
	}
	if !n.IPv6On() || n.IPv6CIDR() != netmanage.ULA("lab") || n.Mode6() != netmanage.ModeSLAAC || !n.NAT6On() {
		t.Fatalf("defaults: %s %s nat6 %v", n.IPv6CIDR(), n.Mode6(), n.NAT6On())
	}
	if u := netmanage.ULA("lab"); !strings.HasPrefix(u, "fd") || !strings.HasSuffix(u, "::1/64") || u == netmanage.ULA("lab2") {
		t.Fatalf("ULA(lab) = %s, ULA(lab2) = %s", u, netmanage.ULA("lab2"))
	}
	n, err = parse("ipv6 = \"fd00:77::1/64\"\nipv6_mode = \"both\"\nnat6 = false\n")
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	if g := n.GuestIPv6(mac).String(); g != "fd00:77::5054:ff:fe12:3456" || n.Gateway6().String() != "fd00:77::1" || n.NAT6On() {
		t.Fatalf("guest %s gateway %s nat6 %v", g, n.Gateway6(), n.NAT6On())
	}
	if n, err = parse("ipv6 = \"none\"\n"); err != nil || n.IPv6On() || n.GuestIPv6(mac) != nil {
		t.Fatalf("ipv6 none: %v", err)
	}
	for body, want := range map[string]string{
		"ipv6 = \"fd00:77::1/48\"\n":               "lab.toml: ipv6: prefix /48: want /64",
		"ipv6 = \"10.1.0.1/24\"\n":                 "lab.toml: ipv6: \"10.1.0.1/24\" is not an IPv6 address",
		"ipv6 = \"fd00:77::/64\"\n":                "lab.toml: ipv6: fd00:77:: is not a host address",
		"ipv6 = \"fe80::1/64\"\n":                  "lab.toml: ipv6: fe80::1 is not a host address",
		"ipv6_mode = \"stateful\"\n":               "lab.toml: ipv6_mode: invalid value \"stateful\"",
		"ipv6 = \"none\"\nipv6_mode = \"slaac\"\n": "lab.toml: ipv6: is \"none\"",
	} {
		if _, err := parse(body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}
