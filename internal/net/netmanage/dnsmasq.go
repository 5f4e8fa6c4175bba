package netmanage

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/units"
)

// DnsmasqUnit is the unit of the network's dnsmasq ("@" keeps it out of
// the VM list).
func DnsmasqUnit(network string) string { return "vmsup-dnsmasq@" + network + ".service" }

// dnsmasqArgv runs dnsmasq in the foreground on the bridge only: DHCP for
// the NICs in the network's dhcp-hosts directory (static leases only, no
// lease file: vmsup keeps the addresses), with IPv6 router adverts and
// DHCPv6 as the network's mode says, DNS for the names in its
// dns-hosts directory (the network's domain answered locally), the rest
// forwarded to the host's resolvers. It stays root with only the network
// capabilities its sandbox leaves it (it changes to no other user or group:
// an empty --group keeps it from Debian's default "dip").
func (m *Manager) dnsmasqArgv(n *Network) []string {
	bin := m.Dnsmasq
	if bin == "" {
		bin = "/usr/sbin/dnsmasq"
	}
	sub := n.Subnet()
	argv := []string{bin, "--keep-in-foreground", "--conf-file=/dev/null", "--pid-file=", "--user=root", "--group=",
		"--log-facility=-", "--interface=" + n.Bridge, "--bind-interfaces", "--except-interface=lo",
		fmt.Sprintf("--dhcp-range=%s,static,%s,1h", sub.IP, net.IP(sub.Mask)),
		"--dhcp-authoritative", "--leasefile-ro", "--dhcp-ignore-names", "--dhcp-option=option:router," + n.Gateway().String(),
		"--dhcp-hostsdir=" + m.dhcpDir(n.Name), "--hostsdir=" + m.dnsDir(n.Name), "--no-hosts",
		"--domain=" + n.DNSDomain(), "--local=/" + n.DNSDomain() + "/", "--domain-needed"}
	if n.IPv6On() {
		argv = append(argv, "--enable-ra", "--dhcp-range="+dhcpRange6(n))
	}
	return argv
}

// dhcpRange6 is the IPv6 dhcp-range of the network's mode: router
// adverts only, with the prefix for SLAAC ("ra-only": the A flag); static
// DHCPv6 leases, announced by the adverts' M flag, the prefix on-link but
// not for SLAAC ("static"); or both ("static,slaac").
func dhcpRange6(n *Network) string {
	mode := map[string]string{ModeSLAAC: "ra-only", ModeDHCPv6: "static", ModeBoth: "static,slaac"}[n.Mode6()]
	return fmt.Sprintf("%s,%s,64,1h", n.Prefix6().IP, mode)
}

// dnsmasqUnit is the network's dnsmasq as a sandboxed unit: root with
// only the capabilities to bind port 53 and 67 and send DHCP replies,
// the host's network, the network's directory read-only, the rest of the
// host read-only or hidden.
func (m *Manager) dnsmasqUnit(n *Network) units.Unit {
	return units.Unit{
		Name:        DnsmasqUnit(n.Name),
		Description: fmt.Sprintf("vmsup network %s: DHCP and DNS on %s", n.Name, n.Bridge),
		Argv:        m.dnsmasqArgv(n),
		Collect:     true,
		TasksMax:    16,
		MemoryMax:   64 << 20,
		Sandbox: &units.Sandbox{
			Capabilities:      []string{"CAP_NET_BIND_SERVICE", "CAP_NET_ADMIN", "CAP_NET_RAW"},
			HostNetwork:       true,
			Netlink:           true,
			ReadOnlyBindPaths: []string{m.dir(n.Name)},
		},
	}
}

// startDnsmasq starts the network's dnsmasq unless it runs, and waits
// until it answers DNS on the gateway (TCP 53).
func (m *Manager) startDnsmasq(ctx context.Context, n *Network) error {
	sd, err := m.Systemd(ctx)
	if err != nil {
		return fmt.Errorf("dnsmasq: %w", err)
	}
	st, err := sd.Status(ctx, DnsmasqUnit(n.Name))
	if err != nil {
		return fmt.Errorf("dnsmasq: %w", err)
	}
	if st.Exists && st.ActiveState == "active" {
		return nil
	}
	if st.Exists {
		sd.Stop(ctx, st.Name)
		sd.ResetFailed(ctx, st.Name)
	}
	if err := sd.Start(ctx, m.dnsmasqUnit(n)); err != nil {
		return fmt.Errorf("dnsmasq: %w", err)
	}
	addr := net.JoinHostPort(n.Gateway().String(), "53")
	var d net.Dialer
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := d.DialContext(cctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			st, _ := sd.Status(ctx, DnsmasqUnit(n.Name))
			return fmt.Errorf("dnsmasq (unit %s, %s): not answering on %s within 10s: %w", DnsmasqUnit(n.Name), st.ActiveState, addr, err)
		}
	}
}

// stopDnsmasq stops the network's dnsmasq; a missing unit is not an error.
func (m *Manager) stopDnsmasq(ctx context.Context, network string) error {
	sd, err := m.Systemd(ctx)
	if err != nil {
		return fmt.Errorf("dnsmasq: %w", err)
	}
	if err := sd.Stop(ctx, DnsmasqUnit(network)); err != nil {
		return fmt.Errorf("dnsmasq: %w", err)
	}
	return sd.ResetFailed(ctx, DnsmasqUnit(network))
}

// reloadDnsmasq makes dnsmasq forget removed static leases (SIGHUP; the
// names it drops by itself). Best effort: a dnsmasq that is not running
// has nothing to forget.
func (m *Manager) reloadDnsmasq(ctx context.Context, network string) {
	sd, err := m.Systemd(ctx)
	if err != nil {
		m.logger().Debug("dnsmasq reload", "network", network, "err", err)
		return
	}
	if st, err := sd.Status(ctx, DnsmasqUnit(network)); err != nil || st.ActiveState != "active" {
		return
	}
	if err := sd.Kill(ctx, DnsmasqUnit(network), syscall.SIGHUP); err != nil {
		m.logger().Warn("dnsmasq reload", "network", network, "err", err)
	}
}

// releaseLease ends the NIC's lease in dnsmasq (dhcp_release, from
// dnsmasq-utils, sends the DHCPRELEASE the guest did not), so the address
// is free for another MAC at once. Best effort: without the tool, or with
// dnsmasq gone, the lease ends when it expires (1h).
func (m *Manager) releaseLease(ctx context.Context, a *Attachment) {
	bin, err := exec.LookPath("dhcp_release")
	if err != nil || !netsetup.LinkExists(a.Bridge) {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(cctx, bin, a.Bridge, a.IP, a.MAC).CombinedOutput(); err != nil {
		m.logger().Warn("dhcp_release", "network", a.Network, "ip", a.IP, "err", err, "out", string(out))
	}
}

// dnsmasqState is the dnsmasq unit's state ("inactive" when it is gone).
func (m *Manager) dnsmasqState(ctx context.Context, network string) string {
	sd, err := m.Systemd(ctx)
	if err != nil {
		return "unknown: " + err.Error()
	}
	st, err := sd.Status(ctx, DnsmasqUnit(network))
	if err != nil {
		return "unknown: " + err.Error()
	}
	if !st.Exists {
		return "inactive"
	}
	return st.ActiveState
}
