package netmanage

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/net/nicfilter"
)

// IPv6 modes: how guests get their address, from dnsmasq's router adverts
// (SLAAC, the address made from the guest's MAC), by DHCPv6 (the same
// address, as a static lease of the MAC), or both.
const (
	ModeSLAAC  = "slaac"
	ModeDHCPv6 = "dhcpv6"
	ModeBoth   = "both"
	// NoIPv6 is the ipv6 value of an IPv4-only network.
	NoIPv6 = "none"
)

// IPv6On reports whether the network has IPv6.
func (n *Network) IPv6On() bool { return n.IPv6 != NoIPv6 }

// IPv6CIDR is the host's IPv6 address on the bridge with the network's
// /64: the file's, or the name's ULA ("" without IPv6).
func (n *Network) IPv6CIDR() string {
	switch n.IPv6 {
	case NoIPv6:
		return ""
	case "":
		return ULA(n.Name)
	}
	return n.IPv6
}

// Gateway6 is the host's IPv6 address on the bridge (nil without IPv6).
func (n *Network) Gateway6() net.IP {
	ip, _, _ := net.ParseCIDR(n.IPv6CIDR())
	return ip
}

// Prefix6 is the network's IPv6 /64 (nil without IPv6).
func (n *Network) Prefix6() *net.IPNet {
	_, p, _ := net.ParseCIDR(n.IPv6CIDR())
	return p
}

// Mode6 is how guests get their IPv6 address (ModeSLAAC by default).
func (n *Network) Mode6() string {
	if n.IPv6Mode == "" {
		return ModeSLAAC
	}
	return n.IPv6Mode
}

// NAT6On reports whether IPv6 leaving the network is masqueraded (NAT66)
// rather than routed; by default as IPv4 is.
func (n *Network) NAT6On() bool {
	if n.NAT6 != nil {
		return *n.NAT6
	}
	return n.NATOn()
}

// GuestIPv6 is the address of the guest with mac on the network: the one
// SLAAC makes from the prefix and the MAC (modified EUI-64), and its
// DHCPv6 lease. nil without IPv6.
func (n *Network) GuestIPv6(mac net.HardwareAddr) net.IP {
	p := n.Prefix6()
	if p == nil || len(mac) != 6 {
		return nil
	}
	ip := make(net.IP, 16)
	copy(ip, p.IP.To16()[:8])
	copy(ip[8:], nicfilter.EUI64(mac))
	return ip
}

// ULA is the default IPv6 address of a network called name: ::1 in a
// unique local /64 (RFC 4193) whose global ID is taken from a hash of the
// name, so the same name gives the same prefix on every host and run.
func ULA(name string) string {
	h := sha256.Sum256([]byte("vmsup network " + name))
	ip := make(net.IP, 16)
	ip[0] = 0xfd
	copy(ip[1:6], h[:5])
	ip[15] = 1
	return ip.String() + "/64"
}

// check6 validates the IPv6 fields; the error's field names the key.
func (n *Network) check6() (string, error) {
	switch n.IPv6Mode {
	case "", ModeSLAAC, ModeDHCPv6, ModeBoth:
	default:
		return "ipv6_mode", fmt.Errorf("invalid value %q (want %q, %q or %q)", n.IPv6Mode, ModeSLAAC, ModeDHCPv6, ModeBoth)
	}
	if !n.IPv6On() {
		if n.IPv6Mode != "" || n.NAT6 != nil {
			return "ipv6", errors.New(`is "none": drop ipv6_mode and nat6, or give the network IPv6`)
		}
		return "", nil
	}
	ip, p, err := net.ParseCIDR(n.IPv6CIDR())
	if err != nil || ip.To4() != nil {
		return "ipv6", fmt.Errorf("%q is not an IPv6 address with its prefix (like \"fd00:77::1/64\"), or \"none\"", n.IPv6)
	}
	if ones, _ := p.Mask.Size(); ones != 64 {
		return "ipv6", fmt.Errorf("prefix /%d: want /64 (SLAAC makes guests' addresses in a /64)", ones)
	}
	if ip.Equal(p.IP) || !ip.IsGlobalUnicast() {
		return "ipv6", fmt.Errorf("%s is not a host address of %s (the prefix's first address, link-local or multicast)", ip, p)
	}
	if n.NAT6On() && !n.NATOn() && n.Uplink != "" {
		return "nat6", errors.New("masquerades to the uplink, which is for NAT: set nat = true too, or nat6 = false")
	}
	return "", nil
}

// sysctl6 sets an IPv6 setting of one interface.
func sysctl6(ifname, key, value string) error {
	p := filepath.Join("/proc/sys/net/ipv6/conf", ifname, key)
	if err := os.WriteFile(p, []byte(value+"\n"), 0o644); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errors.New(`the kernel has no IPv6 here (booted with ipv6.disable=1?): give the network ipv6 = "none"`)
		}
		return err
	}
	return nil
}

// ensureBridge6 gives the bridge the host's IPv6 address (without
// duplicate address detection, so dnsmasq can bind it at once) and keeps
// the host from taking router adverts on it (anti-spoofing drops guests'
// anyway).
func ensureBridge6(n *Network, l netlink.Link) error {
	for _, kv := range [][2]string{{"disable_ipv6", "0"}, {"accept_ra", "0"}} {
		if err := sysctl6(n.Bridge, kv[0], kv[1]); err != nil {
			return fmt.Errorf("bridge %s: %s: %w", n.Bridge, kv[0], err)
		}
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.Gateway6(), Mask: n.Prefix6().Mask}, Flags: unix.IFA_F_NODAD}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("bridge %s: address %s: %w", n.Bridge, n.IPv6CIDR(), err)
	}
	return nil
}

// ip6Forward is the kernel's IPv6 forwarding switch for all interfaces.
const ip6Forward = "/proc/sys/net/ipv6/conf/all/forwarding"

// enableForward6 turns IPv6 forwarding on (never off again, as for
// IPv4), unless that would lose the host its own routes: an interface
// with accept_ra = 1 ignores router adverts once forwarding is on, and
// the routes they gave it expire. libvirt refuses such a host too.
func enableForward6() error {
	if b, err := os.ReadFile(ip6Forward); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: unix.RTPROT_RA}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("IPv6 routes: %w", err)
	}
	var risky []string
	for _, r := range routes {
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc/sys/net/ipv6/conf", l.Attrs().Name, "accept_ra"))
		if strings.TrimSpace(string(b)) == "1" {
			risky = append(risky, l.Attrs().Name)
		}
	}
	if len(risky) > 0 {
		return fmt.Errorf("turning IPv6 forwarding on would lose the routes %s learned from router adverts (accept_ra = 1 ignores them on a router): set net.ipv6.conf.%s.accept_ra = 2 first, or give the network ipv6 = \"none\"",
			risky[0], risky[0])
	}
	if err := os.WriteFile(ip6Forward, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable IPv6 forwarding: %w", err)
	}
	return nil
}

func nat6Table(name string) string { return "vmsup-nat6-" + name }

// setNAT6 replaces the network's NAT66 table: IPv6 from the prefix to
// elsewhere, leaving other than through the bridge (and only through the
// uplink if named), is masqueraded.
func setNAT6(n *Network) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv6, Name: nat6Table(n.Name)}
	c.AddTable(t)
	c.DelTable(t) // with the add before it: replace, in one transaction
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	prefix := n.Prefix6().IP.To16()[:8] // a /64: its first 8 bytes
	in := func(off uint32, op expr.CmpOp) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 8},
			&expr.Cmp{Op: op, Register: 1, Data: prefix}}
	}
	oif := func(op expr.CmpOp, name string) []expr.Any {
		b := make([]byte, unix.IFNAMSIZ)
		copy(b, name)
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: b}}
	}
	r := append(in(8, expr.CmpOpEq), in(24, expr.CmpOpNeq)...)
	r = append(r, oif(expr.CmpOpNeq, n.Bridge)...)
	if n.Uplink != "" {
		r = append(r, oif(expr.CmpOpEq, n.Uplink)...)
	}
	r = append(r, &expr.Counter{}, &expr.Masq{})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
	return c.Flush()
}

// up6 makes the network's IPv6 routing: forwarding, and NAT66 or none.
func up6(n *Network) error {
	if err := enableForward6(); err != nil {
		return err
	}
	if n.NAT6On() {
		return setNAT6(n)
	}
	return removeTable(nftables.TableFamilyIPv6, nat6Table(n.Name))
}

// removeTable deletes a table if it is there.
func removeTable(fam nftables.TableFamily, name string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	ts, err := c.ListTablesOfFamily(fam)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if t.Name == name {
			c.DelTable(t)
			return c.Flush()
		}
	}
	return nil
}
