package spec

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// SecurityGroup is a named set of rules filtering the traffic of the
// network NICs that name it (nic.security_groups), applied on the host
// with nftables per tap. Traffic a rule does not match gets the group's
// policy for its direction; replies to allowed traffic always pass. A NIC
// with several groups passes what any of them allows, and its policy for
// a direction is "deny" if any group's is.
type SecurityGroup struct {
	Name     string         `toml:"name"`
	Inbound  string         `toml:"inbound"`  // policy for traffic to the guest: "deny" (default) or "allow"
	Outbound string         `toml:"outbound"` // policy for traffic from the guest: "allow" (default) or "deny"
	Rules    []SecurityRule `toml:"rule"`
}

// SecurityRule is one rule of a security group.
type SecurityRule struct {
	Direction string `toml:"direction"` // "in" (to the guest) or "out" (from it)
	Action    string `toml:"action"`    // "allow" (default) or "deny"
	Protocol  string `toml:"protocol"`  // "tcp", "udp", "icmp" (ICMPv6 for IPv6) or "any" (default)
	Ports     string `toml:"ports"`     // tcp/udp: the guest's port for in, the peer's for out: "80" or "8000-8100"; "" all
	// CIDR is the peer's addresses, an IPv4 or an IPv6 network: the rule
	// is of that family. Default (or "any") any peer of either family.
	CIDR string `toml:"cidr"`
}

// Security group policies and rule words.
const (
	PolicyAllow = "allow"
	PolicyDeny  = "deny"
	DirIn       = "in"
	DirOut      = "out"
)

// InboundPolicy is the group's policy for traffic to the guest.
func (g *SecurityGroup) InboundPolicy() string {
	if g.Inbound == "" {
		return PolicyDeny
	}
	return g.Inbound
}

// OutboundPolicy is the group's policy for traffic from the guest.
func (g *SecurityGroup) OutboundPolicy() string {
	if g.Outbound == "" {
		return PolicyAllow
	}
	return g.Outbound
}

// Allows reports whether the rule allows (rather than denies).
func (r *SecurityRule) Allows() bool { return r.Action != PolicyDeny }

// PortRange is the rule's port range; 0, 0 for all ports.
func (r *SecurityRule) PortRange() (lo, hi uint16, err error) {
	if r.Ports == "" {
		return 0, 0, nil
	}
	a, b, isRange := strings.Cut(r.Ports, "-")
	if !isRange {
		b = a
	}
	l, err1 := strconv.ParseUint(a, 10, 16)
	h, err2 := strconv.ParseUint(b, 10, 16)
	if err1 != nil || err2 != nil || l == 0 || h < l {
		return 0, 0, fmt.Errorf("invalid ports %q (want \"PORT\" or \"FROM-TO\", 1..65535)", r.Ports)
	}
	return uint16(l), uint16(h), nil
}

// Net is the rule's peer network: nil when the rule is for any peer of
// either family (CIDR "" or "any"), else an IPv4 or IPv6 network.
func (r *SecurityRule) Net() (*net.IPNet, error) {
	if r.CIDR == "" || r.CIDR == "any" {
		return nil, nil
	}
	_, n, err := net.ParseCIDR(r.CIDR)
	if err != nil {
		return nil, fmt.Errorf("invalid cidr %q (want a network like \"10.0.0.0/8\" or \"fd00::/8\", or \"any\")", r.CIDR)
	}
	return n, nil
}

// check validates the rule; the error names the failing key.
func (r *SecurityRule) check() (string, error) {
	switch r.Direction {
	case DirIn, DirOut:
	default:
		return "direction", fmt.Errorf("invalid value %q (want \"in\" or \"out\")", r.Direction)
	}
	switch r.Action {
	case "", PolicyAllow, PolicyDeny:
	default:
		return "action", fmt.Errorf("invalid value %q (want \"allow\" or \"deny\")", r.Action)
	}
	switch r.Protocol {
	case "", "any", "icmp":
		if r.Ports != "" {
			return "ports", fmt.Errorf("ports need protocol \"tcp\" or \"udp\"")
		}
	case "tcp", "udp":
	default:
		return "protocol", fmt.Errorf("invalid value %q (want \"tcp\", \"udp\", \"icmp\" or \"any\")", r.Protocol)
	}
	if _, _, err := r.PortRange(); err != nil {
		return "ports", err
	}
	if _, err := r.Net(); err != nil {
		return "cidr", err
	}
	return "", nil
}

// Group returns the VM's security group called name, or nil.
func (vm *VM) Group(name string) *SecurityGroup {
	for i := range vm.SecurityGroups {
		if vm.SecurityGroups[i].Name == name {
			return &vm.SecurityGroups[i]
		}
	}
	return nil
}

// validateSecurityGroups checks the groups and that every group a NIC
// names exists.
func (f *File) validateSecurityGroups() error {
	seen := map[string]int{}
	for i, g := range f.VM.SecurityGroups {
		field := fmt.Sprintf("security_group[%d]", i)
		if err := ValidName(g.Name); err != nil {
			return f.Errorf(field+".name", "%v", err)
		}
		if j, dup := seen[g.Name]; dup {
			return f.Errorf(field+".name", "duplicate security group %q (also security_group[%d])", g.Name, j)
		}
		seen[g.Name] = i
		for k, p := range []string{g.Inbound, g.Outbound} {
			if p != "" && p != PolicyAllow && p != PolicyDeny {
				return f.Errorf(field+"."+[]string{"inbound", "outbound"}[k], "security group %q: invalid policy %q (want \"allow\" or \"deny\")", g.Name, p)
			}
		}
		for j, r := range g.Rules {
			if key, err := r.check(); err != nil {
				return f.Errorf(fmt.Sprintf("%s.rule[%d].%s", field, j, key), "security group %q: %v", g.Name, err)
			}
		}
	}
	for i, n := range f.VM.NICs {
		for _, g := range n.SecurityGroups {
			if _, ok := seen[g]; !ok {
				return f.Errorf(fmt.Sprintf("nic[%d].security_groups", i), "nic %q: no [[security_group]] named %q in this file", n.Name, g)
			}
		}
	}
	return nil
}

// PickGroups returns the groups of all named in names, in names' order;
// a name without a group is skipped (the file's check refuses it).
func PickGroups(all []SecurityGroup, names []string) []SecurityGroup {
	var out []SecurityGroup
	for _, name := range names {
		for _, g := range all {
			if g.Name == name {
				out = append(out, g)
			}
		}
	}
	return out
}
