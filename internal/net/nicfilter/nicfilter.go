// Package nicfilter owns the nftables tables that filter one tap NIC of a
// managed network: anti-spoofing (a table of the bridge family: the guest
// sends only from its MAC and its addresses, answers ARP and neighbour
// discovery only for its addresses, runs no DHCP or DHCPv6 server, sends
// no router adverts or redirects, sends nothing but IPv4, ARP and, on a
// network with IPv6, IPv6) and its security groups (a table of the inet
// family, where the bridge's br_netfilter hands bridged IPv4 and IPv6
// packets to conntrack, so replies to allowed traffic pass). Each tap has its own two tables, named after it,
// replaced in one nftables transaction when the filter changes and
// deleted when the NIC goes, so a table never outlives its tap by more
// than the clean-up that removes both.
//
// It does not own the tap, the bridge or the addresses (internal/net/netmanage
// decides them); it talks to the kernel with github.com/google/nftables,
// in the calling thread's network namespace.
package nicfilter

import (
	"fmt"
	"net"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/vmsup/vmsup/spec"
)

// Filter is what one tap's tables enforce.
type Filter struct {
	Tap string
	MAC net.HardwareAddr // the guest's MAC
	IP  net.IP           // the guest's IPv4 address
	// IPv6 is the guest's global IPv6 address (its SLAAC address, also
	// its DHCPv6 lease); nil: the network has no IPv6 and the guest may
	// send none. With it, the guest may send from it and from its
	// link-local address (LinkLocal of its MAC).
	IPv6 net.IP
	// AntiSpoofing: the bridge table that drops what the guest sends as
	// another MAC or address, ARP and neighbour adverts for other
	// addresses, DHCP and DHCPv6 server replies, router adverts and
	// redirects, and other protocols.
	AntiSpoofing bool
	// Groups are the NIC's security groups; none: no inet table.
	Groups []spec.SecurityGroup
}

// Table names of a tap: the bridge family's (anti-spoofing) and the inet
// family's (security groups).
func spoofTable(tap string) string { return "vmsup-as-" + tap }
func groupTable(tap string) string { return "vmsup-sg-" + tap }

// TableNames are the nftables tables a tap's filter may have, as
// "FAMILY NAME" (what `nft list tables` prints after "table").
func TableNames(tap string) []string {
	return []string{"bridge " + spoofTable(tap), "inet " + groupTable(tap)}
}

// Apply replaces the tap's tables with f's, in one transaction: traffic is
// never unfiltered in between, and a failure leaves the old tables.
func Apply(f Filter) error {
	if f.IP.To4() == nil || len(f.MAC) != 6 {
		return fmt.Errorf("nic filter %s: need the guest's MAC and IPv4 address (have %q, %v)", f.Tap, f.MAC, f.IP)
	}
	if f.IPv6 != nil && (f.IPv6.To4() != nil || f.IPv6.To16() == nil) {
		return fmt.Errorf("nic filter %s: %v is not an IPv6 address", f.Tap, f.IPv6)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	have, err := existing(c, f.Tap)
	if err != nil {
		return err
	}
	for _, t := range have {
		c.DelTable(t)
	}
	if f.AntiSpoofing {
		addSpoofTable(c, f)
	}
	if len(f.Groups) > 0 {
		if err := addGroupTable(c, f); err != nil {
			return fmt.Errorf("nic filter %s: %w", f.Tap, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nic filter %s: nftables: %w", f.Tap, err)
	}
	return nil
}

// Remove deletes the tap's tables; missing ones are not an error.
func Remove(tap string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	have, err := existing(c, tap)
	if err != nil || len(have) == 0 {
		return err
	}
	for _, t := range have {
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nic filter %s: remove: %w", tap, err)
	}
	return nil
}

// existing lists the tap's tables that are there now.
func existing(c *nftables.Conn, tap string) ([]*nftables.Table, error) {
	var out []*nftables.Table
	for fam, name := range map[nftables.TableFamily]string{nftables.TableFamilyBridge: spoofTable(tap), nftables.TableFamilyINet: groupTable(tap)} {
		ts, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("nftables: list tables: %w", err)
		}
		for _, t := range ts {
			if t.Name == name {
				out = append(out, t)
			}
		}
	}
	return out, nil
}

// Counts are the packets a tap's filter dropped.
type Counts struct {
	Spoofed  uint64 `json:"spoofed"`  // by anti-spoofing
	Filtered uint64 `json:"filtered"` // by security groups
	Tables   int    `json:"tables"`   // how many of the tap's tables exist
}

// Read returns the tap's drop counters and how many of its tables exist.
func Read(tap string) (Counts, error) {
	var n Counts
	c, err := nftables.New()
	if err != nil {
		return n, err
	}
	have, err := existing(c, tap)
	if err != nil {
		return n, err
	}
	n.Tables = len(have)
	for _, t := range have {
		chains, err := c.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return n, err
		}
		for _, ch := range chains {
			if ch.Table.Name != t.Name {
				continue
			}
			rules, err := c.GetRules(t, ch)
			if err != nil {
				return n, err
			}
			for _, r := range rules {
				for _, e := range r.Exprs {
					if ctr, ok := e.(*expr.Counter); ok {
						if t.Family == nftables.TableFamilyBridge {
							n.Spoofed += ctr.Packets
						} else {
							n.Filtered += ctr.Packets
						}
					}
				}
			}
		}
	}
	return n, nil
}

// ListTables lists every nftables table as "FAMILY NAME" (tests and
// status look for leftovers with it).
func ListTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	ts, err := c.ListTables()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range ts {
		out = append(out, familyName(t.Family)+" "+t.Name)
	}
	slices.Sort(out)
	return out, nil
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprint(uint8(f))
}
