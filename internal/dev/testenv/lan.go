package testenv

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
)

// LAN is a Linux bridge in the test's network namespace (call
// InPrivateNetns first) with an address of its own, where services the
// hosts share (etcd, Ceph) listen, and which hosts (StartSystemdHost
// sandboxes) join through veth pairs.
type LAN struct {
	Bridge string
	Prefix string // "10.98.0.": the bridge is .1, hosts .10 and up
	Addr   string // the bridge's address, Prefix+"1"
}

// NewLAN makes the bridge and gives it Prefix+"1"/24.
func NewLAN(bridge, prefix string) (*LAN, error) {
	l := &LAN{Bridge: bridge, Prefix: prefix, Addr: prefix + "1"}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("testenv: bridge %s: %w", bridge, err)
	}
	for _, argv := range [][]string{
		{"ip", "addr", "add", l.Addr + "/24", "dev", bridge},
		{"ip", "link", "set", bridge, "up"},
	} {
		if err := run(argv...); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
}

// Close deletes the bridge (the hosts' veths go with their namespaces).
func (l *LAN) Close() error {
	link, err := netlink.LinkByName(l.Bridge)
	if err != nil {
		return nil
	}
	return netlink.LinkDel(link)
}

// Join connects the sandbox's network namespace to the LAN: a veth pair
// whose inside end is eth0 with address Prefix+N/24, lo up too. It returns
// the address.
func (l *LAN) Join(s *Systemd, n int) (string, error) {
	addr := fmt.Sprintf("%s%d", l.Prefix, n)
	outside := fmt.Sprintf("vl%s%d", strings.ReplaceAll(l.Prefix, ".", ""), n)
	if len(outside) > 15 {
		outside = outside[len(outside)-15:]
	}
	tmp := outside + "i"
	if len(tmp) > 15 {
		tmp = tmp[1:]
	}
	pid := fmt.Sprint(s.PID1)
	for _, argv := range [][]string{
		{"ip", "link", "add", outside, "type", "veth", "peer", "name", tmp},
		{"ip", "link", "set", outside, "master", l.Bridge},
		{"ip", "link", "set", outside, "up"},
		{"ip", "link", "set", tmp, "netns", pid},
		{"nsenter", "-t", pid, "-n", "ip", "link", "set", tmp, "name", "eth0"},
		{"nsenter", "-t", pid, "-n", "ip", "addr", "add", addr + "/24", "dev", "eth0"},
		{"nsenter", "-t", pid, "-n", "ip", "link", "set", "eth0", "up"},
		{"nsenter", "-t", pid, "-n", "ip", "link", "set", "lo", "up"},
	} {
		if err := run(argv...); err != nil {
			return "", err
		}
	}
	return addr, nil
}

// SetLink brings the sandbox's eth0 down (a cut network) or up again.
func (l *LAN) SetLink(s *Systemd, up bool) error {
	state := map[bool]string{true: "up", false: "down"}[up]
	return run("nsenter", "-t", fmt.Sprint(s.PID1), "-n", "ip", "link", "set", "eth0", state)
}

func run(argv ...string) error {
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: %s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
