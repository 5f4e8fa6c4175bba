package netmanage

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/pelletier/go-toml/v2"

	"github.com/vmsup/vmsup/spec"
)

// Network is a managed network's definition, a TOML file:
//
//	name = "lab"
//	ipv4 = "10.77.0.1/24"   # the host's address on the bridge and the subnet
//	bridge = "vmsn-lab"     # default "vmsn-" + name (when that fits 15 bytes)
//	nat = true              # default true: masquerade to the uplink
//	uplink = "eth0"         # NAT only out of it; default any other interface
//	domain = "lab"          # the DNS domain of the VMs' names; default name
//	ipv6 = "fd00:1:2::1/64" # the host's IPv6 address and /64; default a ULA
//	                        # /64 made from the name (ULA); "none": IPv4 only
//	ipv6_mode = "slaac"     # router adverts for SLAAC (default), "dhcpv6"
//	                        # (stateful), or "both"
//	nat6 = true             # default nat's value: NAT66 to the uplink;
//	                        # false: routed (the prefix routed to the host)
type Network struct {
	Name     string `toml:"name"`
	Bridge   string `toml:"bridge"`
	IPv4     string `toml:"ipv4"`
	NAT      *bool  `toml:"nat"`
	Uplink   string `toml:"uplink"`
	Domain   string `toml:"domain"`
	IPv6     string `toml:"ipv6"`
	IPv6Mode string `toml:"ipv6_mode"`
	NAT6     *bool  `toml:"nat6"`
}

// NATOn reports whether the network masquerades to the uplink.
func (n *Network) NATOn() bool { return n.NAT == nil || *n.NAT }

// Gateway is the host's address on the bridge; Subnet the network.
func (n *Network) Gateway() net.IP {
	ip, _, _ := net.ParseCIDR(n.IPv4)
	return ip.To4()
}

// Subnet is the network's IPv4 subnet.
func (n *Network) Subnet() *net.IPNet {
	_, s, _ := net.ParseCIDR(n.IPv4)
	return s
}

// DNSDomain is the domain of the VMs' names.
func (n *Network) DNSDomain() string {
	if n.Domain != "" {
		return n.Domain
	}
	return n.Name
}

// FieldError is a definition's failure, naming its file and field.
type FieldError struct {
	File, Field string
	Err         error
}

func (e *FieldError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("network: %s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("%s: %s: %v", e.File, e.Field, e.Err)
}
func (e *FieldError) Unwrap() error { return e.Err }

// Parse reads a definition (file names it in errors) and fills defaults.
func Parse(file string, data []byte) (*Network, error) {
	var n Network
	if err := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields().Decode(&n); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) && len(sm.Errors) > 0 {
			return nil, &FieldError{file, fmt.Sprint(sm.Errors[0].Key()), errors.New("unknown key (want name, ipv4, bridge, nat, uplink, domain, ipv6, ipv6_mode, nat6)")}
		}
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := n.check(file); err != nil {
		return nil, err
	}
	return &n, nil
}

// Load reads the definition in path.
func Load(path string) (*Network, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	n, err := Parse(path, b)
	return n, b, err
}

// check validates n and fills the bridge's default name.
func (n *Network) check(file string) error {
	fail := func(field string, format string, args ...any) error {
		return &FieldError{file, field, fmt.Errorf(format, args...)}
	}
	if err := spec.ValidName(n.Name); err != nil {
		return fail("name", "%v", err)
	}
	if n.Bridge == "" {
		n.Bridge = "vmsn-" + n.Name
		if len(n.Bridge) > spec.MaxIfName {
			return fail("bridge", "the default bridge name %q is longer than %d bytes: name one", n.Bridge, spec.MaxIfName)
		}
	}
	if err := spec.ValidIfName(n.Bridge); err != nil {
		return fail("bridge", "%v", err)
	}
	ip, sub, err := net.ParseCIDR(n.IPv4)
	if err != nil || ip.To4() == nil {
		return fail("ipv4", "%q is not an IPv4 address with its prefix (like \"10.77.0.1/24\")", n.IPv4)
	}
	if ones, _ := sub.Mask.Size(); ones > 29 || ones < 8 {
		return fail("ipv4", "prefix /%d: want /8 to /29", ones)
	}
	if ip.Equal(sub.IP) || ip.Equal(broadcast(sub)) {
		return fail("ipv4", "%s is the subnet's network or broadcast address, not a host address", ip)
	}
	if n.Uplink != "" {
		if err := spec.ValidIfName(n.Uplink); err != nil {
			return fail("uplink", "%v", err)
		}
		if !n.NATOn() {
			return fail("uplink", "is the NAT's way out: set nat = true or drop uplink")
		}
	}
	if n.Domain != "" {
		if err := spec.ValidName(n.Domain); err != nil {
			return fail("domain", "%v", err)
		}
	}
	if field, err := n.check6(); err != nil {
		return fail(field, "%v", err)
	}
	return nil
}

// broadcast is the subnet's last address.
func broadcast(s *net.IPNet) net.IP {
	b := make(net.IP, 4)
	for i := range b {
		b[i] = s.IP.To4()[i] | ^s.Mask[i]
	}
	return b
}
