package libvirtimport

import (
	"fmt"
	"net"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// DefaultNetworkBridge is the bridge of libvirt's "default" network.
const DefaultNetworkBridge = "virbr0"

func (c *converter) nics(ifaces []libvirtxml.DomainInterface) {
	for i := range ifaces {
		if n, ok := c.nic(i, &ifaces[i]); ok {
			c.out.NICs = append(c.out.NICs, n)
		}
	}
}

// nic maps one interface; false drops it.
func (c *converter) nic(i int, in *libvirtxml.DomainInterface) (fileNIC, bool) {
	el := fmt.Sprintf("devices/interface[%d]", i)
	n := fileNIC{Name: fmt.Sprintf("net%d", i), el: el}
	s := in.Source
	switch {
	case s != nil && s.Bridge != nil:
		n.Type, n.Bridge = spec.NICBridge, s.Bridge.Bridge
	case s != nil && s.Network != nil:
		c.libvirtNetwork(el, s.Network, &n)
	case s != nil && s.User != nil:
		n.Type = spec.NICUser
	default:
		c.drop(el, "this interface type: vmsup's NICs are user, bridge, ovs or cni")
		return n, false
	}
	if vp := in.VirtualPort; vp != nil && vp.Params != nil && vp.Params.OpenVSwitch != nil && n.Type == spec.NICBridge {
		n.Type = spec.NICOVS
	} else if vp != nil && n.Type == spec.NICNetwork {
		c.drop(el+"/virtualport", "a managed network is a Linux bridge vmsup makes: no virtual port")
	}
	if in.MAC != nil {
		n.MAC = strings.ToLower(in.MAC.Address)
	}
	if in.Model != nil && in.Model.Type != "virtio" {
		c.drop(el+"/model", "%q: vmsup's NICs are virtio-net (the guest sees another NIC)", in.Model.Type)
	}
	if n.Type != spec.NICUser {
		tapSettings(in, &n)
	}
	c.nicTuning(el, in, &n)
	c.addresses(el, in, &n)
	c.filterRef(el, in.FilterRef, &n)
	if in.Link != nil && in.Link.State == "down" {
		n.Link = spec.LinkDown
	}
	if in.Boot != nil {
		c.drop(el+"/boot", "no network boot in vmsup (its NICs have no option ROM)")
	}
	for _, x := range []struct {
		el  string
		set bool
	}{{"bandwidth", in.Bandwidth != nil}, {"vlan", in.VLan != nil}} {
		if x.set {
			c.drop(el+"/"+x.el, "bandwidth and VLAN settings: set them on the bridge or OVS port")
		}
	}
	return n, true
}

// tapSettings: what a tap NIC keeps of the interface.
func tapSettings(in *libvirtxml.DomainInterface, n *fileNIC) {
	if in.Target != nil && len(in.Target.Dev) <= 15 && !strings.HasPrefix(in.Target.Dev, "vnet") {
		n.Tap = in.Target.Dev // libvirt's own vnetN names are picked afresh
	}
	if in.MTU != nil {
		n.MTU = in.MTU.Size
	}
	if dr := in.Driver; dr != nil {
		if dr.Queues > 1 {
			n.Queues = dr.Queues
		}
		switch dr.Name {
		case "vhost":
			n.Vhost = "on"
		case "qemu":
			n.Vhost = "off"
		}
	}
}

// libvirtNetwork maps a NIC on the libvirt network s names: onto the
// vmsup managed network of that name when the host has one, else onto
// the libvirt network's bridge.
func (c *converter) libvirtNetwork(el string, s *libvirtxml.DomainInterfaceSourceNetwork, n *fileNIC) {
	name := s.Network
	if c.networks[name] {
		n.Type, n.Network = spec.NICNetwork, name
		return
	}
	n.Type, n.Bridge = spec.NICBridge, s.Bridge
	if n.Bridge == "" {
		n.Bridge = name
		if name == "default" {
			n.Bridge = DefaultNetworkBridge
		}
	}
	c.note(el+"/source", "libvirt network %q: vmsup attaches the NIC to its bridge %q (check with virsh net-info %s); "+
		"or make a vmsup managed network called %q (vmsup network create) and import again to put the NIC on it",
		name, n.Bridge, name, name)
}

// addresses maps the interface's <ip> elements: the first IPv4 address
// of a NIC on a managed network is its static lease (nic.ip; the
// network's subnet gives the prefix, which libvirt's QEMU driver does not
// give the guest either); any other is listed.
func (c *converter) addresses(el string, in *libvirtxml.DomainInterface, n *fileNIC) {
	for i, a := range in.IP {
		ipEl := fmt.Sprintf("%s/ip[%d] (%s)", el, i, a.Address)
		ip := net.ParseIP(a.Address)
		switch {
		case n.Type == spec.NICUser:
			c.drop(ipEl, "the user network's addresses: vmsup's user NICs have QEMU's 10.0.2.0/24")
		case n.Type != spec.NICNetwork:
			c.drop(ipEl, "vmsup gives a NIC an address only on a managed network (nic.ip, a static DHCP lease)")
		case ip == nil || ip.To4() == nil || a.Family == "ipv6":
			c.drop(ipEl, "a managed network gives the NIC the IPv6 address SLAAC makes from its MAC (its DHCPv6 lease too): only an IPv4 address is carried")
		case a.Peer != "":
			c.drop(ipEl, "a peer address (%s): a managed network NIC has its address on the network's subnet", a.Peer)
		case n.IP != "":
			c.drop(ipEl, "one address per NIC on a managed network: nic.ip is %s", n.IP)
		default:
			n.IP = ip.String()
		}
	}
}

// cleanTraffic is libvirt's nwfilter that vmsup's anti-spoofing stands for.
const cleanTraffic = "clean-traffic"

// filterRef maps a libvirt nwfilter reference: clean-traffic on a managed
// network NIC is its anti-spoofing (on by default), its IP parameter the
// NIC's address; any other filter is listed by name. A managed network
// NIC without clean-traffic keeps anti-spoofing on, with a line saying so.
func (c *converter) filterRef(el string, f *libvirtxml.DomainInterfaceFilterRef, n *fileNIC) {
	fel := el + "/filterref"
	switch {
	case f == nil:
	case f.Filter != cleanTraffic:
		c.drop(fel, "nwfilter %q is not carried: vmsup's NIC filters are anti-spoofing (on managed networks, like clean-traffic) and [[security_group]] rules", f.Filter)
	case n.Type != spec.NICNetwork:
		c.drop(fel, "nwfilter %q: vmsup's anti-spoofing is for NICs on managed networks (type \"network\"); on this %s NIC nothing filters the guest", f.Filter, n.Type)
	default:
		c.cleanTrafficParams(fel, f.Parameters, n)
	}
	if n.Type == spec.NICNetwork && (f == nil || f.Filter != cleanTraffic) {
		c.note(el, "no clean-traffic filter in libvirt, but vmsup drops spoofed traffic on managed networks by default "+
			"(the guest sends only from its MAC, its IPv4 address and its IPv6 link-local and SLAAC addresses); allow_spoofing = true restores libvirt's behaviour")
	}
}

// cleanTrafficParams carries clean-traffic's IP parameter (one IPv4
// address) as the NIC's address; the others have no counterpart.
func (c *converter) cleanTrafficParams(fel string, ps []libvirtxml.DomainInterfaceFilterParam, n *fileNIC) {
	for i, p := range ps {
		pel := fmt.Sprintf("%s/parameter[%d] (%s)", fel, i, p.Name)
		ip := net.ParseIP(p.Value)
		switch {
		case p.Name != "IP":
			c.drop(pel, "%s=%s: vmsup's anti-spoofing takes no parameters (it allows the NIC's MAC and its leased or declared address, and learns none)", p.Name, p.Value)
		case ip == nil || ip.To4() == nil:
			c.drop(pel, "IP=%s: on a managed network anti-spoofing passes the NIC's IPv6 link-local and SLAAC addresses (made from its MAC), no other", p.Value)
		case n.IP != "" && n.IP != ip.String():
			c.drop(pel, "IP=%s: one address per NIC on a managed network: nic.ip is %s", p.Value, n.IP)
		default:
			n.IP = ip.String()
		}
	}
}
