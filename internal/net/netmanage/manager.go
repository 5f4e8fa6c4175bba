package netmanage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/units"
)

// Manager makes, lists and removes the managed networks of one state
// root, and their NICs' host side.
type Manager struct {
	// Dir holds one directory per network (ROOT/networks).
	Dir string
	// Systemd is the connection that runs the networks' dnsmasq units.
	Systemd func(ctx context.Context) (*units.Manager, error)
	// Dnsmasq is the dnsmasq binary; "" = /usr/sbin/dnsmasq.
	Dnsmasq string
	Logger  *slog.Logger
	// AfterStep, when set, sees each journaled step of a network's
	// operation (as supervisor.Options.AfterStep: faults, traces).
	AfterStep func(network, step string)
}

// ErrNotFound: no network of that name is defined.
var ErrNotFound = errors.New("no such network")

// InUseError: the network has NICs (of the VMs named).
type InUseError struct {
	Network string
	VMs     []string
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("network %q is used by VM %s: stop it (vmsup down) or move its NIC first", e.Network, strings.Join(e.VMs, ", VM "))
}

func (m *Manager) dir(name string) string      { return filepath.Join(m.Dir, name) }
func (m *Manager) defFile(name string) string  { return filepath.Join(m.dir(name), "network.toml") }
func (m *Manager) nicsDir(name string) string  { return filepath.Join(m.dir(name), "nics") }
func (m *Manager) dhcpDir(name string) string  { return filepath.Join(m.dir(name), "dhcp-hosts") }
func (m *Manager) dnsDir(name string) string   { return filepath.Join(m.dir(name), "dns-hosts") }
func (m *Manager) lockFile(name string) string { return filepath.Join(m.Dir, "."+name+".lock") }
func natTable(name string) string              { return "vmsup-nat-" + name }
func (m *Manager) logger() *slog.Logger {
	if m.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.Logger
}

// lock takes the network's lock (definition, attachments, addresses), then
// settles what a killed command left on the network (settle): note says
// what that was.
func (m *Manager) lock(ctx context.Context, name string) (unlock func(), note string, err error) {
	lk, err := m.takeLock(ctx, name, true)
	if err != nil || lk == nil {
		return nil, "", err
	}
	if note, err = m.settle(ctx, name); err != nil {
		lk.Unlock()
		return nil, "", err
	}
	return func() { lk.Unlock() }, note, nil
}

// takeLock takes the network's lock, waiting up to 30 s when wait is set
// (nil without an error when another holds it and wait is not).
func (m *Manager) takeLock(ctx context.Context, name string, wait bool) (*vmstore.FileLock, error) {
	if err := os.MkdirAll(m.Dir, 0o755); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lk, ok, err := vmstore.LockFile(lctx, m.lockFile(name), wait)
	if err != nil {
		return nil, fmt.Errorf("network %q: lock: %w", name, err)
	}
	if !ok && wait {
		return nil, fmt.Errorf("network %q: lock not free within 30s", name)
	}
	return lk, nil
}

// Get reads the definition of the network called name.
func (m *Manager) Get(name string) (*Network, error) {
	n, _, err := Load(m.defFile(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("network %q: %w (vmsup network ls lists them)", name, ErrNotFound)
	}
	return n, err
}

// Names lists the defined networks.
func (m *Manager) Names() ([]string, error) {
	ents, err := os.ReadDir(m.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(m.defFile(e.Name())); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}
	return out, err
}

// Create defines the network (raw is its file, kept as it was written)
// and brings it up. A name, bridge or subnet another network has is
// refused, as is a bridge that exists already.
func (m *Manager) Create(ctx context.Context, n *Network, raw []byte) error {
	unlock, _, err := m.lock(ctx, n.Name)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(m.defFile(n.Name)); err == nil {
		return fmt.Errorf("network %q is already defined (vmsup network rm %s first)", n.Name, n.Name)
	}
	names, err := m.Names()
	if err != nil {
		return err
	}
	for _, other := range names {
		o, err := m.Get(other)
		if err != nil {
			continue
		}
		if o.Bridge == n.Bridge {
			return fmt.Errorf("network %q: bridge %s is network %q's", n.Name, n.Bridge, other)
		}
		if o.Subnet().Contains(n.Subnet().IP) || n.Subnet().Contains(o.Subnet().IP) {
			return fmt.Errorf("network %q: subnet %s overlaps network %q's %s", n.Name, n.Subnet(), other, o.Subnet())
		}
		if n.IPv6On() && o.IPv6On() && o.Prefix6().Contains(n.Prefix6().IP) {
			return fmt.Errorf("network %q: IPv6 prefix %s is network %q's", n.Name, n.Prefix6(), other)
		}
	}
	if netsetup.LinkExists(n.Bridge) {
		return fmt.Errorf("network %q: a link called %s exists already; name another bridge", n.Name, n.Bridge)
	}
	for _, d := range []string{m.nicsDir(n.Name), m.dhcpDir(n.Name), m.dnsDir(n.Name)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := atomicfile.WriteFile(m.defFile(n.Name), raw, 0o644); err != nil {
		return err
	}
	if err := m.up(ctx, n); err != nil {
		m.down(ctx, n)
		os.RemoveAll(m.dir(n.Name))
		return err
	}
	return nil
}

// Ensure brings the network up if any of it is missing (after a host
// reboot, or dnsmasq ended): the bridge, its address, NAT, dnsmasq.
func (m *Manager) Ensure(ctx context.Context, name string) (*Network, error) {
	unlock, _, err := m.lock(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return m.ensure(ctx, name)
}

// ensure is Ensure under the network's lock.
func (m *Manager) ensure(ctx context.Context, name string) (*Network, error) {
	n, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	return n, m.up(ctx, n)
}

// up makes what is missing of the network; idempotent.
func (m *Manager) up(ctx context.Context, n *Network) error {
	if err := ensureBridge(n); err != nil {
		return fmt.Errorf("network %q: %w", n.Name, err)
	}
	if n.NATOn() {
		if err := setNAT(n); err != nil {
			return fmt.Errorf("network %q: NAT: %w", n.Name, err)
		}
	}
	if n.IPv6On() {
		if err := up6(n); err != nil {
			return fmt.Errorf("network %q: IPv6: %w", n.Name, err)
		}
	}
	if err := m.startDnsmasq(ctx, n); err != nil {
		return fmt.Errorf("network %q: %w", n.Name, err)
	}
	return nil
}

// down removes what the network made: dnsmasq, NAT, the bridge.
func (m *Manager) down(ctx context.Context, n *Network) error {
	return errors.Join(m.stopDnsmasq(ctx, n.Name), removeNAT(n.Name), deleteBridge(n.Bridge))
}

// Info is one network as ls shows it.
type Info struct {
	Name   string `json:"name"`
	Bridge string `json:"bridge"`
	IPv4   string `json:"ipv4"`
	NAT    bool   `json:"nat"`
	// IPv6 is the host's IPv6 address with the /64 ("" without IPv6),
	// IPv6Mode how guests get theirs, NAT6 whether it is masqueraded.
	IPv6     string   `json:"ipv6,omitempty"`
	IPv6Mode string   `json:"ipv6_mode,omitempty"`
	NAT6     bool     `json:"nat6,omitempty"`
	Uplink   string   `json:"uplink,omitempty"`
	Domain   string   `json:"domain"`
	Up       bool     `json:"bridge_up"` // the bridge exists
	Dnsmasq  string   `json:"dnsmasq"`   // the dnsmasq unit's state
	NICs     []NICRef `json:"nics"`
	Error    string   `json:"error,omitempty"`
}

// NICRef is a NIC on the network.
type NICRef struct {
	VM  string `json:"vm"`
	NIC string `json:"nic"`
	Tap string `json:"tap"`
	MAC string `json:"mac"`
	IP  string `json:"ip"`
	// IPv6 is its global IPv6 address ("" without IPv6).
	IPv6 string `json:"ipv6,omitempty"`
}

// List describes every defined network.
func (m *Manager) List(ctx context.Context) ([]Info, error) {
	names, err := m.Names()
	if err != nil {
		return nil, err
	}
	out := []Info{}
	for _, name := range names {
		info := Info{Name: name}
		m.settleIfFree(ctx, name)
		n, err := m.Get(name)
		if errors.Is(err, ErrNotFound) {
			continue // a killed rm, finished now
		}
		if err != nil {
			info.Error = err.Error()
			out = append(out, info)
			continue
		}
		info.Bridge, info.IPv4, info.NAT, info.Uplink, info.Domain = n.Bridge, n.IPv4, n.NATOn(), n.Uplink, n.DNSDomain()
		if n.IPv6On() {
			info.IPv6, info.IPv6Mode, info.NAT6 = n.IPv6CIDR(), n.Mode6(), n.NAT6On()
		}
		info.Up = netsetup.LinkExists(n.Bridge)
		info.Dnsmasq = m.dnsmasqState(ctx, name)
		atts, _ := m.attachments(name)
		info.NICs = []NICRef{}
		for _, a := range atts {
			info.NICs = append(info.NICs, NICRef{VM: a.VM, NIC: a.NIC, Tap: a.Tap, MAC: a.MAC, IP: a.IP, IPv6: a.IPv6})
		}
		out = append(out, info)
	}
	return out, nil
}

// writeJSON writes v to path atomically.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o644)
}
