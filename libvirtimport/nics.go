package libvirtimport

import (
	"fmt"
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
		n.Type, n.Bridge = spec.NICBridge, s.Network.Bridge
		if n.Bridge == "" {
			n.Bridge = s.Network.Network
			if s.Network.Network == "default" {
				n.Bridge = DefaultNetworkBridge
			}
		}
		c.note(el+"/source", "libvirt network %q: vmsup attaches the NIC to its bridge %q (check with virsh net-info %s)",
			s.Network.Network, n.Bridge, s.Network.Network)
	case s != nil && s.User != nil:
		n.Type = spec.NICUser
	default:
		c.drop(el, "this interface type: vmsup's NICs are user, bridge, ovs or cni")
		return n, false
	}
	if vp := in.VirtualPort; vp != nil && vp.Params != nil && vp.Params.OpenVSwitch != nil && n.Type == spec.NICBridge {
		n.Type = spec.NICOVS
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
	if in.Link != nil && in.Link.State == "down" {
		n.Link = spec.LinkDown
	}
	if in.Boot != nil {
		c.drop(el+"/boot", "no network boot in vmsup (its NICs have no option ROM)")
	}
	for _, x := range []struct {
		el  string
		set bool
	}{{"bandwidth", in.Bandwidth != nil}, {"vlan", in.VLan != nil}, {"filterref", in.FilterRef != nil}} {
		if x.set {
			c.drop(el+"/"+x.el, "bandwidth, VLAN and filter settings: set them on the bridge or OVS port")
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
