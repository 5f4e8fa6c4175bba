package nicfilter

import (
	"encoding/binary"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/spec"
)

// Byte offsets of the fields the rules read.
const (
	ethSrc    = 6  // Ethernet source MAC (link-layer header)
	ethType   = 12 // EtherType
	ipSrc     = 12 // IPv4 source (network header)
	ipDst     = 16 // IPv4 destination
	arpHType  = 0  // ARP hardware type
	arpPType  = 2  // ARP protocol type
	arpSHA    = 8  // ARP sender MAC
	arpSPA    = 14 // ARP sender IPv4
	thSrcPort = 0  // TCP/UDP source port (transport header)
	thDstPort = 2  // TCP/UDP destination port
)

// bridgeFilterPriority is the bridge family's filter priority
// (NF_BR_PRI_FILTER_BRIDGED): before br_netfilter hands the packet to the
// IP hooks (priority 0), so a spoofed packet never reaches conntrack.
const bridgeFilterPriority = -200

var accept = nftables.ChainPolicyAccept

// rb builds rules: a list of expressions per rule.
type rb []expr.Any

func load(base expr.PayloadBase, off, n uint32) rb {
	return rb{&expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: n}}
}

func (r rb) eq(data []byte) rb {
	return append(r, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data})
}
func (r rb) neq(data []byte) rb {
	return append(r, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: data})
}
func (r rb) then(more ...expr.Any) rb {
	return append(r, more...)
}
func (r rb) with(o rb) rb { return append(r, o...) }

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }
func jump(chain string) expr.Any          { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }
func countDrop() []expr.Any               { return []expr.Any{&expr.Counter{}, verdict(expr.VerdictDrop)} }

func meta(k expr.MetaKey) rb { return rb{&expr.Meta{Key: k, Register: 1}} }

func ifname(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// l4 matches the transport protocol.
func l4(proto byte) rb { return meta(expr.MetaKeyL4PROTO).eq([]byte{proto}) }

// ipv4 matches IPv4 packets in the inet family.
func ipv4() rb { return meta(expr.MetaKeyNFPROTO).eq([]byte{unix.NFPROTO_IPV4}) }

// ipIs matches the IPv4 address at off against ip.
func ipIs(off uint32, ip net.IP) rb { return load(expr.PayloadBaseNetworkHeader, off, 4).eq(ip.To4()) }

// inNet matches the address at off (IPv4 or IPv6, as n) against a
// network (nothing for /0).
func inNet(off uint32, n *net.IPNet) rb {
	ones, bits := n.Mask.Size()
	if ones == 0 {
		return nil
	}
	size := uint32(bits / 8)
	r := load(expr.PayloadBaseNetworkHeader, off, size)
	r = append(r, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: []byte(n.Mask), Xor: make([]byte, size)})
	ip := n.IP.To4()
	if bits == 128 {
		ip = n.IP.To16()
	}
	return r.eq(ip)
}

// addSpoofTable adds the bridge table: frames from the tap pass only as
// the guest's MAC and address.
func addSpoofTable(c *nftables.Conn, f Filter) {
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: spoofTable(f.Tap)})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(bridgeFilterPriority), Policy: &accept})
	guard := c.AddChain(&nftables.Chain{Name: "guard", Table: t})
	arp := c.AddChain(&nftables.Chain{Name: "arp", Table: t})
	ip := c.AddChain(&nftables.Chain{Name: "ip", Table: t})
	add := func(ch *nftables.Chain, r rb) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r}) }
	mac := []byte(f.MAC)
	zero := net.IPv4zero.To4()

	add(pre, meta(expr.MetaKeyIIFNAME).eq(ifname(f.Tap)).then(jump(guard.Name)))
	// Another source MAC: a changed MAC, or frames made up for another.
	add(guard, load(expr.PayloadBaseLLHeader, ethSrc, 6).neq(mac).then(countDrop()...))
	add(guard, load(expr.PayloadBaseLLHeader, ethType, 2).eq(be16(unix.ETH_P_ARP)).then(jump(arp.Name)))
	add(guard, load(expr.PayloadBaseLLHeader, ethType, 2).eq(be16(unix.ETH_P_IP)).then(jump(ip.Name)))
	if f.IPv6 != nil {
		ip6 := addSpoof6(c, t, f)
		add(guard, load(expr.PayloadBaseLLHeader, ethType, 2).eq(be16(unix.ETH_P_IPV6)).then(jump(ip6.Name)))
	}
	add(guard, rb(countDrop())) // IPv6 on an IPv4 network, VLAN tags, anything else

	// ARP: Ethernet/IPv4 only, as the guest's MAC, for its address (or
	// 0.0.0.0, an address probe).
	arpField := func(off, n uint32) rb { return load(expr.PayloadBaseNetworkHeader, off, n) }
	add(arp, arpField(arpHType, 2).neq(be16(1)).then(countDrop()...))
	add(arp, arpField(arpPType, 2).neq(be16(unix.ETH_P_IP)).then(countDrop()...))
	add(arp, arpField(arpSHA, 6).neq(mac).then(countDrop()...))
	add(arp, arpField(arpSPA, 4).eq(f.IP.To4()).then(verdict(expr.VerdictAccept)))
	add(arp, arpField(arpSPA, 4).eq(zero).then(verdict(expr.VerdictAccept)))
	add(arp, rb(countDrop()))

	// IPv4: no DHCP server; the guest's own address, or 0.0.0.0 asking
	// for a DHCP lease.
	udp := l4(unix.IPPROTO_UDP)
	add(ip, udp.with(load(expr.PayloadBaseTransportHeader, thSrcPort, 2).eq(be16(67))).then(countDrop()...))
	add(ip, ipIs(ipSrc, f.IP).then(verdict(expr.VerdictAccept)))
	add(ip, ipIs(ipSrc, zero).with(l4(unix.IPPROTO_UDP)).
		with(load(expr.PayloadBaseTransportHeader, thSrcPort, 2).eq(be16(68))).
		with(load(expr.PayloadBaseTransportHeader, thDstPort, 2).eq(be16(67))).then(verdict(expr.VerdictAccept)))
	add(ip, rb(countDrop()))
}

// addGroupTable adds the inet table of the NIC's security groups: packets
// to the guest's address go through "in", from it through "out", whether
// bridged (br_netfilter), routed or the host's own.
func addGroupTable(c *nftables.Conn, f Filter) error {
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: groupTable(f.Tap)})
	base := func(name string, hook *nftables.ChainHook) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: hook, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	}
	fwd, out, in := base("forward", nftables.ChainHookForward), base("output", nftables.ChainHookOutput), base("input", nftables.ChainHookInput)
	toGuest := c.AddChain(&nftables.Chain{Name: "to-guest", Table: t})
	fromGuest := c.AddChain(&nftables.Chain{Name: "from-guest", Table: t})
	add := func(ch *nftables.Chain, r rb) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r}) }

	add(fwd, ipv4().with(ipIs(ipDst, f.IP)).then(jump(toGuest.Name)))
	add(fwd, ipv4().with(ipIs(ipSrc, f.IP)).then(jump(fromGuest.Name)))
	add(out, ipv4().with(ipIs(ipDst, f.IP)).then(jump(toGuest.Name)))
	add(in, ipv4().with(ipIs(ipSrc, f.IP)).then(jump(fromGuest.Name)))
	if f.IPv6 != nil {
		for _, ip := range []net.IP{f.IPv6, LinkLocal(f.MAC)} {
			add(fwd, ipv6().with(ip6Is(ip6Dst, ip)).then(jump(toGuest.Name)))
			add(fwd, ipv6().with(ip6Is(ip6Src, ip)).then(jump(fromGuest.Name)))
			add(out, ipv6().with(ip6Is(ip6Dst, ip)).then(jump(toGuest.Name)))
			add(in, ipv6().with(ip6Is(ip6Src, ip)).then(jump(fromGuest.Name)))
		}
	}

	established := rb{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: make([]byte, 4)}}.
		neq(make([]byte, 4)).then(verdict(expr.VerdictAccept))
	// The network's own DHCP always reaches the guest, and its DHCP and
	// DNS always reach the network.
	dhcpReply := l4(unix.IPPROTO_UDP).with(load(expr.PayloadBaseTransportHeader, thSrcPort, 2).eq(be16(67))).
		with(load(expr.PayloadBaseTransportHeader, thDstPort, 2).eq(be16(68))).then(verdict(expr.VerdictAccept))
	add(toGuest, established)
	add(toGuest, dhcpReply)
	add(fromGuest, established)
	if f.IPv6 != nil {
		// Neighbour discovery and router solicits/adverts both ways, and
		// the network's DHCPv6 replies (anti-spoofing stops a guest's).
		nd := l4(unix.IPPROTO_ICMPV6).with(load(expr.PayloadBaseTransportHeader, icmp6Type, 1))
		nd = append(nd, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{icmp6RouterSolicit}, ToData: []byte{icmp6NeighAdvert}})
		add(toGuest, nd.then(verdict(expr.VerdictAccept)))
		add(fromGuest, nd.then(verdict(expr.VerdictAccept)))
		add(toGuest, l4(unix.IPPROTO_UDP).with(load(expr.PayloadBaseTransportHeader, thSrcPort, 2).eq(be16(dhcp6Sv))).
			with(load(expr.PayloadBaseTransportHeader, thDstPort, 2).eq(be16(dhcp6Client))).then(verdict(expr.VerdictAccept)))
	}

	inPolicy, outPolicy := spec.PolicyAllow, spec.PolicyAllow
	for _, g := range f.Groups {
		if g.InboundPolicy() == spec.PolicyDeny {
			inPolicy = spec.PolicyDeny
		}
		if g.OutboundPolicy() == spec.PolicyDeny {
			outPolicy = spec.PolicyDeny
		}
	}
	// Deny rules first, so an explicit deny wins over another group's allow.
	for _, allow := range []bool{false, true} {
		for _, g := range f.Groups {
			for _, r := range g.Rules {
				if r.Allows() != allow {
					continue
				}
				ms, err := ruleMatches(r, f.IPv6 != nil)
				if err != nil {
					return err
				}
				v := []expr.Any{verdict(expr.VerdictAccept)}
				if !allow {
					v = countDrop()
				}
				ch := toGuest
				if r.Direction == spec.DirOut {
					ch = fromGuest
				}
				for _, m := range ms {
					add(ch, m.then(v...))
				}
			}
		}
	}
	if inPolicy == spec.PolicyDeny {
		add(toGuest, rb(countDrop()))
	}
	if outPolicy == spec.PolicyDeny {
		add(fromGuest, rb(countDrop()))
	}
	return nil
}

// ruleMatches are a rule's matches, one per address family it covers
// (its network's, or both when it names none and the NIC has IPv6): the
// peer's network, the protocol (ICMPv6 for "icmp" in IPv6), the
// destination ports.
func ruleMatches(r spec.SecurityRule, withIPv6 bool) ([]rb, error) {
	n, err := r.Net()
	if err != nil {
		return nil, err
	}
	lo, hi, err := r.PortRange()
	if err != nil {
		return nil, err
	}
	var out []rb
	for _, v6 := range []bool{false, true} {
		if (n != nil && (n.IP.To4() == nil) != v6) || (n == nil && v6 && !withIPv6) {
			continue
		}
		out = append(out, familyMatch(r, n, v6, lo, hi))
	}
	return out, nil
}

// familyMatch is a rule's match in one address family.
func familyMatch(r spec.SecurityRule, n *net.IPNet, v6 bool, lo, hi uint16) rb {
	peer, m, icmp := uint32(ipSrc), ipv4(), byte(unix.IPPROTO_ICMP)
	if r.Direction == spec.DirOut {
		peer = ipDst
	}
	if v6 {
		peer, m, icmp = ip6Src, ipv6(), unix.IPPROTO_ICMPV6
		if r.Direction == spec.DirOut {
			peer = ip6Dst
		}
	}
	if n != nil {
		m = m.with(inNet(peer, n))
	}
	switch r.Protocol {
	case "tcp":
		m = m.with(l4(unix.IPPROTO_TCP))
	case "udp":
		m = m.with(l4(unix.IPPROTO_UDP))
	case "icmp":
		m = m.with(l4(icmp))
	}
	if lo != 0 {
		m = m.with(load(expr.PayloadBaseTransportHeader, thDstPort, 2))
		if lo == hi {
			return m.eq(be16(lo))
		}
		m = append(m, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(lo), ToData: be16(hi)})
	}
	return m
}
