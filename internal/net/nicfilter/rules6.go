package nicfilter

import (
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Byte offsets of the IPv6 and ICMPv6 fields the rules read.
const (
	ip6PayloadLen = 4  // IPv6 payload length (network header)
	ip6Src        = 8  // IPv6 source
	ip6Dst        = 24 // IPv6 destination
	icmp6Type     = 0  // ICMPv6 type (transport header)
	ndTarget      = 8  // NS/NA target address
	ndOptType     = 24 // the first ND option's type
	ndOptMAC      = 26 // a link-layer address option's address
)

// ICMPv6 types the rules name (RFC 4443, 4861, 3810).
const (
	icmp6RouterSolicit   = 133
	icmp6RouterAdvert    = 134
	icmp6NeighSolicit    = 135
	icmp6NeighAdvert     = 136
	icmp6Redirect        = 137
	icmp6RouterRenumber  = 138
	icmp6MLDv2Report     = 143
	ndOptSourceLL        = 1  // source link-layer address
	ndOptTargetLL        = 2  // target link-layer address
	ndOptNonce           = 14 // DAD nonce (RFC 7527)
	ndLen, ndLenWithOpt  = 24, 32
	dhcp6Client, dhcp6Sv = 546, 547
)

// LinkLocal is the EUI-64 link-local address of mac (fe80::/64), the one
// a guest's kernel makes for its NIC.
func LinkLocal(mac net.HardwareAddr) net.IP {
	ip := net.ParseIP("fe80::")
	copy(ip[8:], EUI64(mac))
	return ip
}

// EUI64 is the modified EUI-64 interface identifier of mac (RFC 4291),
// the last 64 bits of the address SLAAC makes from a /64 prefix.
func EUI64(mac net.HardwareAddr) []byte {
	return []byte{mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
}

// ipv6 matches IPv6 packets in the inet family.
func ipv6() rb { return meta(expr.MetaKeyNFPROTO).eq([]byte{unix.NFPROTO_IPV6}) }

// ip6Is matches the IPv6 address at off against ip.
func ip6Is(off uint32, ip net.IP) rb {
	return load(expr.PayloadBaseNetworkHeader, off, 16).eq(ip.To16())
}

// ip6Not matches an IPv6 address at off (network or transport header,
// base) that is none of ips: one rule, its comparisons all must hold.
func ip6Not(base expr.PayloadBase, off uint32, ips ...net.IP) rb {
	var r rb
	for _, ip := range ips {
		r = r.with(load(base, off, 16).neq(ip.To16()))
	}
	return r
}

// icmp6 matches an ICMPv6 message of type typ.
func icmp6(typ byte) rb {
	return l4(unix.IPPROTO_ICMPV6).with(load(expr.PayloadBaseTransportHeader, icmp6Type, 1).eq([]byte{typ}))
}

// plen matches the IPv6 payload length.
func plen(n uint16) rb { return load(expr.PayloadBaseNetworkHeader, ip6PayloadLen, 2).eq(be16(n)) }

// ndOpt matches an NS or NA whose one option (at its end) is of type typ
// and, for a link-layer address option, carries mac.
func ndOpt(typ byte, mac net.HardwareAddr) rb {
	r := plen(ndLenWithOpt).with(load(expr.PayloadBaseTransportHeader, ndOptType, 1).eq([]byte{typ}))
	if mac != nil {
		r = r.with(load(expr.PayloadBaseTransportHeader, ndOptMAC, 6).eq(mac))
	}
	return r
}

// addSpoof6 adds the chains that check what the guest sends as IPv6 and
// returns the one the guard jumps to: no router adverts, redirects or
// router renumbering, no DHCPv6 server; neighbour adverts only for its
// own addresses with its own MAC, neighbour solicits only from its own
// addresses or, probing an address of its own (DAD), from ::; anything
// else only from its link-local or global address (or MLD reports and
// router solicits from ::, before it has an address).
func addSpoof6(c *nftables.Conn, t *nftables.Table, f Filter) *nftables.Chain {
	ip6 := c.AddChain(&nftables.Chain{Name: "ip6", Table: t})
	ns := c.AddChain(&nftables.Chain{Name: "nd-solicit", Table: t})
	dad := c.AddChain(&nftables.Chain{Name: "nd-dad", Table: t})
	na := c.AddChain(&nftables.Chain{Name: "nd-advert", Table: t})
	add := func(ch *nftables.Chain, r rb) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r}) }
	ll, gua, unspec := LinkLocal(f.MAC), f.IPv6.To16(), net.IPv6unspecified
	mac := []byte(f.MAC)
	acceptIt := verdict(expr.VerdictAccept)
	net6, trans := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader

	udp := l4(unix.IPPROTO_UDP)
	add(ip6, udp.with(load(trans, thSrcPort, 2).eq(be16(dhcp6Sv))).then(countDrop()...))
	add(ip6, udp.with(load(trans, thDstPort, 2).eq(be16(dhcp6Client))).then(countDrop()...))
	for _, typ := range []byte{icmp6RouterAdvert, icmp6Redirect, icmp6RouterRenumber} {
		add(ip6, icmp6(typ).then(countDrop()...))
	}
	add(ip6, icmp6(icmp6NeighSolicit).then(jump(ns.Name)))
	add(ip6, icmp6(icmp6NeighAdvert).then(jump(na.Name)))
	add(ip6, ip6Is(ip6Src, ll).then(acceptIt))
	add(ip6, ip6Is(ip6Src, gua).then(acceptIt))
	add(ip6, ip6Is(ip6Src, unspec).with(icmp6(icmp6MLDv2Report)).then(acceptIt))
	add(ip6, ip6Is(ip6Src, unspec).with(icmp6(icmp6RouterSolicit)).then(acceptIt))
	add(ip6, rb(countDrop()))

	// Neighbour solicits: any target from its own address, with its MAC.
	add(ns, ip6Is(ip6Src, unspec).then(jump(dad.Name)))
	add(ns, ip6Not(net6, ip6Src, ll, gua).then(countDrop()...))
	add(ns, plen(ndLen).then(acceptIt))
	add(ns, ndOpt(ndOptSourceLL, mac).then(acceptIt))
	add(ns, rb(countDrop()))
	// Duplicate address detection: only for its own addresses.
	add(dad, ip6Not(trans, ndTarget, ll, gua).then(countDrop()...))
	add(dad, plen(ndLen).then(acceptIt))
	add(dad, ndOpt(ndOptNonce, nil).then(acceptIt))
	add(dad, rb(countDrop()))
	// Neighbour adverts: for its own addresses, from them, with its MAC.
	add(na, ip6Not(net6, ip6Src, ll, gua).then(countDrop()...))
	add(na, ip6Not(trans, ndTarget, ll, gua).then(countDrop()...))
	add(na, plen(ndLen).then(acceptIt))
	add(na, ndOpt(ndOptTargetLL, mac).then(acceptIt))
	add(na, rb(countDrop()))
	return ip6
}
