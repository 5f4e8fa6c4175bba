package netmanage

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ensureBridge makes the network's bridge with the host's address, up,
// with its bridged IPv4 and IPv6 handed to the IP hooks (security groups'
// conntrack), and its IPv6 address unless the network has none.
func ensureBridge(n *Network) error {
	l, err := netlink.LinkByName(n.Bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("bridge %s: %w", n.Bridge, err)
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Bridge}}); err != nil {
			return fmt.Errorf("bridge %s: create: %w", n.Bridge, err)
		}
		if l, err = netlink.LinkByName(n.Bridge); err != nil {
			return fmt.Errorf("bridge %s: %w", n.Bridge, err)
		}
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return fmt.Errorf("bridge %s: the link of that name is a %s, not a bridge; left alone", n.Bridge, l.Type())
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.Gateway(), Mask: n.Subnet().Mask}}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("bridge %s: address %s: %w", n.Bridge, n.IPv4, err)
	}
	if n.IPv6On() {
		if err := ensureBridge6(n, l); err != nil {
			return err
		}
	}
	if err := setNFCallIPTables(l); err != nil {
		return fmt.Errorf("bridge %s: nf_call_iptables: %w", n.Bridge, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bridge %s: up: %w", n.Bridge, err)
	}
	return nil
}

// setNFCallIPTables sets the bridge's own nf_call_iptables and
// nf_call_ip6tables (IFLA_BR_*), whatever the host's
// net.bridge.bridge-nf-call-ip(6)tables say.
func setNFCallIPTables(l netlink.Link) error {
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		return errors.New("the kernel has no br_netfilter (modprobe br_netfilter): security groups could not see bridged traffic")
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(l.Attrs().Index)
	req.AddData(msg)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("bridge"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(unix.IFLA_BR_NF_CALL_IPTABLES, []byte{1})
	data.AddRtAttr(unix.IFLA_BR_NF_CALL_IP6TABLES, []byte{1})
	req.AddData(info)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// deleteBridge removes the bridge; a missing one is not an error, a link
// of that name that is not a bridge is left alone.
func deleteBridge(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return fmt.Errorf("bridge %s: the link of that name is a %s; left alone", name, l.Type())
	}
	return netlink.LinkDel(l)
}

// ipForward is the kernel's IPv4 forwarding switch (of the caller's
// network namespace).
const ipForward = "/proc/sys/net/ipv4/ip_forward"

// setNAT turns IPv4 forwarding on (as libvirt's NAT networks do; it is not
// turned off again, other routing may rely on it) and replaces the
// network's nat table: what leaves the subnet for elsewhere, other than
// through the bridge (and only through the uplink if named), is
// masqueraded.
func setNAT(n *Network) error {
	if b, err := os.ReadFile(ipForward); err != nil || strings.TrimSpace(string(b)) != "1" {
		if err := os.WriteFile(ipForward, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("enable IPv4 forwarding: %w", err)
		}
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: natTable(n.Name)}
	c.AddTable(t)
	c.DelTable(t) // with the add before it: replace, in one transaction
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	sub := n.Subnet()
	addrIn := func(off uint32, op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte(sub.Mask), Xor: make([]byte, 4)},
			&expr.Cmp{Op: op, Register: 1, Data: sub.IP.To4()},
		}
	}
	ifname := func(op expr.CmpOp, name string) []expr.Any {
		b := make([]byte, unix.IFNAMSIZ)
		copy(b, name)
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: b}}
	}
	r := append(addrIn(12, expr.CmpOpEq), addrIn(16, expr.CmpOpNeq)...)
	r = append(r, ifname(expr.CmpOpNeq, n.Bridge)...)
	if n.Uplink != "" {
		r = append(r, ifname(expr.CmpOpEq, n.Uplink)...)
	}
	r = append(r, &expr.Counter{}, &expr.Masq{})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
	return c.Flush()
}

// removeNAT deletes the network's nat tables (IPv4, IPv6) that are there.
func removeNAT(name string) error {
	return errors.Join(removeTable(nftables.TableFamilyIPv4, natTable(name)), removeTable(nftables.TableFamilyIPv6, nat6Table(name)))
}
