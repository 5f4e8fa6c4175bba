package netmanage

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/internal/net/nicfilter"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/spec"
)

// Attachment is one NIC on a managed network, kept in
// networks/NAME/nics/TAP.json while the NIC exists.
type Attachment struct {
	Network string `json:"network"`
	Bridge  string `json:"bridge"`
	VM      string `json:"vm"`
	NIC     string `json:"nic"`
	Tap     string `json:"tap"`
	MAC     string `json:"mac"`
	IP      string `json:"ip"`
	Static  bool   `json:"static"` // the address is the NIC's nic.ip
	// IPv6 is the NIC's global IPv6 address, made from the network's
	// prefix and the MAC (SLAAC's, and its DHCPv6 lease); "" when the
	// network has no IPv6 (or had none when the NIC was attached).
	IPv6     string `json:"ipv6,omitempty"`
	Hostname string `json:"hostname"`
}

func (m *Manager) attachFile(network, tap string) string {
	return filepath.Join(m.nicsDir(network), tap+".json")
}

// attachments lists the network's NICs.
func (m *Manager) attachments(network string) ([]Attachment, error) {
	ents, err := os.ReadDir(m.nicsDir(network))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Attachment
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		a, err := m.Lookup(network, strings.TrimSuffix(e.Name(), ".json"))
		if err != nil {
			return nil, err
		}
		out = append(out, *a)
	}
	return out, nil
}

// Lookup reads the attachment of tap on network (os.ErrNotExist if none).
func (m *Manager) Lookup(network, tap string) (*Attachment, error) {
	b, err := os.ReadFile(m.attachFile(network, tap))
	if err != nil {
		return nil, err
	}
	var a Attachment
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%s: %w", m.attachFile(network, tap), err)
	}
	return &a, nil
}

// CheckNIC checks a network NIC of vm before anything is made: its network
// is defined and a static address is a free host address of its subnet.
// The error's field is "network" or "ip".
func (m *Manager) CheckNIC(vm string, n spec.NIC) (field string, err error) {
	net, err := m.Get(n.Network)
	if err != nil {
		return "network", err
	}
	if n.IP == "" {
		return "", nil
	}
	atts, err := m.attachments(n.Network)
	if err != nil {
		return "network", err
	}
	return "ip", checkStatic(net, n, vm, atts)
}

// checkStatic: a static address is a host address of the subnet that no
// other NIC has.
func checkStatic(nw *Network, n spec.NIC, vm string, atts []Attachment) error {
	ip := net.ParseIP(n.IP).To4()
	sub := nw.Subnet()
	switch {
	case !sub.Contains(ip):
		return fmt.Errorf("%s is not in network %q's subnet %s", ip, nw.Name, sub)
	case ip.Equal(sub.IP), ip.Equal(broadcast(sub)):
		return fmt.Errorf("%s is network %q's network or broadcast address", ip, nw.Name)
	case ip.Equal(nw.Gateway()):
		return fmt.Errorf("%s is the host's address on network %q", ip, nw.Name)
	}
	for _, a := range atts {
		if a.IP == ip.String() && (a.VM != vm || a.NIC != n.Name) {
			return fmt.Errorf("%s is in use on network %q by VM %q (nic %q)", ip, nw.Name, a.VM, a.NIC)
		}
	}
	return nil
}

// Attach brings the NIC's network up if needed and gives the NIC its
// address and names: the attachment is written first, then dnsmasq's
// static lease and name files. A stale attachment of the same tap (a
// crashed run's) is replaced.
func (m *Manager) Attach(ctx context.Context, vm string, n spec.NIC) (*Attachment, error) {
	unlock, _, err := m.lock(ctx, n.Network)
	if err != nil {
		return nil, err
	}
	defer unlock()
	nw, err := m.ensure(ctx, n.Network)
	if err != nil {
		return nil, err
	}
	atts, err := m.attachments(n.Network)
	if err != nil {
		return nil, err
	}
	others := atts[:0]
	for _, a := range atts {
		if a.Tap != n.Tap {
			others = append(others, a)
		}
	}
	a := &Attachment{Network: nw.Name, Bridge: nw.Bridge, VM: vm, NIC: n.Name, Tap: n.Tap, MAC: strings.ToLower(n.MAC), Hostname: vm}
	if n.IP != "" {
		if err := checkStatic(nw, n, vm, others); err != nil {
			return nil, fmt.Errorf("nic %q: ip: %w", n.Name, err)
		}
		a.IP, a.Static = net.ParseIP(n.IP).To4().String(), true
	} else if a.IP, err = pick(nw, vm+"/"+n.Name, others); err != nil {
		return nil, fmt.Errorf("nic %q: %w", n.Name, err)
	}
	for _, o := range others {
		if o.Hostname == a.Hostname {
			a.Hostname = vm + "-" + n.Name // a second NIC of the VM on this network
		}
	}
	if mac, err := net.ParseMAC(a.MAC); err == nil && nw.IPv6On() {
		a.IPv6 = nw.GuestIPv6(mac).String()
	}
	if err := writeJSON(m.attachFile(nw.Name, n.Tap), a); err != nil {
		return nil, err
	}
	// The lease has no name: DNS answers only from the name files, so a
	// name goes with its file (a lease's would stay until it expires).
	lease := fmt.Sprintf("%s,%s\n", a.MAC, a.IP)
	name := fmt.Sprintf("%s %s %s.%s\n", a.IP, a.Hostname, a.Hostname, nw.DNSDomain())
	if a.IPv6 != "" {
		if nw.Mode6() != ModeSLAAC {
			lease = fmt.Sprintf("%s,%s,[%s]\n", a.MAC, a.IP, a.IPv6)
		}
		name += fmt.Sprintf("%s %s %s.%s\n", a.IPv6, a.Hostname, a.Hostname, nw.DNSDomain())
	}
	if err := atomicfile.WriteFile(filepath.Join(m.dhcpDir(nw.Name), n.Tap), []byte(lease), 0o644); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(filepath.Join(m.dnsDir(nw.Name), n.Tap), []byte(name), 0o644); err != nil {
		return nil, err
	}
	return a, nil
}

// pick chooses a free address from the upper half of the subnet's host
// addresses, starting at one derived from key (the VM and NIC), so a NIC
// gets the same address run after run while it is free.
func pick(nw *Network, key string, atts []Attachment) (string, error) {
	sub := nw.Subnet()
	first := binary.BigEndian.Uint32(sub.IP.To4())
	last := binary.BigEndian.Uint32(broadcast(sub)) - 1
	lo := first + 1 + (last-first)/2
	size := last - lo + 1
	used := map[string]bool{nw.Gateway().String(): true}
	for _, a := range atts {
		used[a.IP] = true
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	start := h.Sum32() % size
	for i := uint32(0); i < size; i++ {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, lo+(start+i)%size)
		if !used[ip.String()] {
			return ip.String(), nil
		}
	}
	return "", fmt.Errorf("network %q: no free address left in %s (upper half of %s)", nw.Name, net.IP(binary.BigEndian.AppendUint32(nil, lo)), sub)
}

// Filter replaces the NIC's nftables filter: anti-spoofing unless
// allowSpoofing, and its security groups.
func Filter(a *Attachment, allowSpoofing bool, groups []spec.SecurityGroup) error {
	mac, err := net.ParseMAC(a.MAC)
	if err != nil {
		return fmt.Errorf("nic %q: mac: %w", a.NIC, err)
	}
	return nicfilter.Apply(nicfilter.Filter{Tap: a.Tap, MAC: mac, IP: net.ParseIP(a.IP), IPv6: net.ParseIP(a.IPv6),
		AntiSpoofing: !allowSpoofing, Groups: groups})
}

// Release removes what Attach and Filter made for the tap, the
// attachment last; idempotent, and it works after the network's
// definition or dnsmasq are gone.
func (m *Manager) Release(ctx context.Context, network, tap string) error {
	errs := []error{nicfilter.Remove(tap)}
	if a, err := m.Lookup(network, tap); err == nil {
		m.releaseLease(ctx, a)
	}
	for _, p := range []string{filepath.Join(m.dhcpDir(network), tap), filepath.Join(m.dnsDir(network), tap), m.attachFile(network, tap)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	m.reloadDnsmasq(ctx, network)
	return errors.Join(errs...)
}

// MoveTap gives the NIC attached by tap from the attachment, lease and
// name files of tap to (a local migration's new QEMU took the guest over
// on its own tap): the address, lease and names stay as they are, and no
// DHCPRELEASE is sent. The filter is not touched (the caller gave to its
// own before the guest moved). Idempotent: once from has nothing left and
// to has its attachment, there is nothing to do.
func (m *Manager) MoveTap(ctx context.Context, network, from, to string) error {
	unlock, _, err := m.lock(ctx, network)
	if err != nil {
		return err
	}
	defer unlock()
	a, err := m.Lookup(network, from)
	if errors.Is(err, os.ErrNotExist) {
		if _, err := m.Lookup(network, to); err != nil {
			return fmt.Errorf("network %q: tap %s has no attachment, nor has %s: %w", network, from, to, err)
		}
		return nil // moved already
	}
	if err != nil {
		return err
	}
	a.Tap = to
	if err := writeJSON(m.attachFile(network, to), a); err != nil {
		return err
	}
	for _, dir := range []string{m.dhcpDir(network), m.dnsDir(network)} {
		b, err := os.ReadFile(filepath.Join(dir, from))
		if errors.Is(err, os.ErrNotExist) {
			if _, err := os.Stat(filepath.Join(dir, to)); err == nil {
				continue // moved before a kill
			}
		}
		if err != nil {
			return err
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, to), b, 0o644); err != nil {
			return err
		}
	}
	for _, p := range []string{filepath.Join(m.dhcpDir(network), from), filepath.Join(m.dnsDir(network), from), m.attachFile(network, from)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	m.reloadDnsmasq(ctx, network) // it forgets a removed file's entries only then
	return nil
}
