package spec

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
)

// Vhost settings of a tap NIC.
const (
	VhostAuto = "auto" // vhost-net where /dev/vhost-net exists
	VhostOn   = "on"   // required: the VM does not start without /dev/vhost-net
	VhostOff  = "off"
)

// MaxIfName is the longest Linux interface name (IFNAMSIZ is 16 with the NUL).
const MaxIfName = 15

// MaxQueues bounds virtio-net queue pairs (QEMU's own limit is 1024; a tap
// takes at most 256 queues).
const MaxQueues = 256

// ifNameRE is what vmsup accepts as an interface name: no '/', ':', spaces
// or '%', so the name is safe in netlink, ovs-vsctl and QEMU arguments.
var ifNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// ValidIfName checks a Linux interface (tap or bridge) name.
func ValidIfName(s string) error {
	if len(s) > MaxIfName {
		return fmt.Errorf("interface name %q is longer than %d bytes (the kernel's IFNAMSIZ limit)", s, MaxIfName)
	}
	if !ifNameRE.MatchString(s) {
		return fmt.Errorf("invalid interface name %q (want letters, digits, '_', '.', '-')", s)
	}
	return nil
}

// DeriveTap returns the default tap name of the NIC named nic of the VM
// named vm: "vmt" and 11 hex digits of a hash of both, so it is stable
// across restarts (a stale tap of a crashed run has the same name and is
// found) and fits IFNAMSIZ whatever the names' lengths.
func DeriveTap(vm, nic string) string {
	h := sha256.Sum256([]byte(vm + "/" + nic))
	return "vmt" + hex.EncodeToString(h[:])[:11]
}

// UsesTap reports whether the NIC's backend is a tap vmsup makes.
func (n *NIC) UsesTap() bool {
	return n.Type == NICBridge || n.Type == NICOVS || n.Type == NICCNI || n.Type == NICNetwork
}

// applyDefaults fills the NIC's type-specific defaults; vm and cpus are the
// VM's name and vCPU count.
func (n *NIC) applyDefaults(vm string, cpus int) {
	if !n.UsesTap() {
		return
	}
	if n.Tap == "" {
		n.Tap = DeriveTap(vm, n.Name)
	}
	if n.Vhost == "" {
		n.Vhost = VhostAuto
	}
	if n.Queues == 0 {
		n.Queues = 1
		if n.Multiqueue {
			n.Queues = cpus
		}
	}
}

// ApplyDefaults fills the defaults of a NIC that is not part of a parsed
// file (a hot-plugged one): i is its index among the VM's NICs.
func (n *NIC) ApplyDefaults(vm *VM, i int) {
	if n.Type == "" {
		n.Type = NICUser
	}
	if n.MAC == "" {
		n.MAC = DeriveMAC(vm.Name, i)
	}
	n.applyDefaults(vm.Name, vm.CPUs)
}

// Check validates the NIC's own fields after defaults and returns the
// failing field's name (relative to the NIC: "type", "bridge", ...) with an
// error (callers add the NIC's name).
func (n *NIC) Check() (string, error) {
	fail := func(field, format string, args ...any) (string, error) {
		return field, fmt.Errorf(format, args...)
	}
	switch n.Link {
	case "", LinkUp, LinkDown:
	default:
		return fail("link", "invalid value %q (want \"up\" or \"down\")", n.Link)
	}
	if field, err := n.nicTuning(); err != nil {
		return field, err
	}
	if field, err := n.checkManaged(); err != nil {
		return field, err
	}
	switch n.Type {
	case NICUser:
		for _, f := range []struct{ name, v string }{{"bridge", n.Bridge}, {"cni_config", n.CNIConfig}, {"tap", n.Tap}} {
			if f.v != "" {
				return fail(f.name, "is not used by type %q", n.Type)
			}
		}
		if n.MTU != 0 || n.Queues != 0 || n.Multiqueue || n.Vhost != "" {
			return fail("type", "mtu, queues, multiqueue and vhost need a tap NIC (type bridge, ovs or cni)")
		}
		return "", nil
	case NICBridge, NICOVS:
		if n.Bridge == "" {
			return fail("bridge", "type %q needs bridge (the name of an existing bridge)", n.Type)
		}
		if err := ValidIfName(n.Bridge); err != nil {
			return fail("bridge", "%v", err)
		}
		if n.CNIConfig != "" {
			return fail("cni_config", "is not used by type %q", n.Type)
		}
	case NICNetwork:
		if n.Bridge != "" || n.CNIConfig != "" {
			return fail("network", "type \"network\" takes the network's name; bridge and cni_config are not used")
		}
	case NICCNI:
		if n.CNIConfig == "" {
			return fail("cni_config", "type \"cni\" needs cni_config (a .conflist file)")
		}
		if !filepath.IsAbs(n.CNIConfig) {
			return fail("cni_config", "%q is not an absolute path", n.CNIConfig)
		}
		if n.Bridge != "" {
			return fail("bridge", "is not used by type \"cni\" (the CNI config says where the NIC goes)")
		}
	default:
		return fail("type", "unknown NIC type %q (want \"user\", \"bridge\", \"ovs\", \"cni\" or \"network\")", n.Type)
	}
	if len(n.Forwards) > 0 {
		return fail("forwards", "host forwards need type \"user\"")
	}
	if err := ValidIfName(n.Tap); err != nil {
		return fail("tap", "%v", err)
	}
	if n.MTU != 0 && (n.MTU < 68 || n.MTU > 65535) {
		return fail("mtu", "%d is out of range 68..65535", n.MTU)
	}
	if n.Queues < 1 || n.Queues > MaxQueues {
		return fail("queues", "%d is out of range 1..%d", n.Queues, MaxQueues)
	}
	switch n.Vhost {
	case VhostAuto, VhostOn, VhostOff:
	default:
		return fail("vhost", "invalid value %q (want \"auto\", \"on\" or \"off\")", n.Vhost)
	}
	return "", nil
}

// checkNetns checks what NICs must agree on across a VM: tap names are
// unique, and a VM with a cni NIC runs in the namespace vmsup makes for it,
// where QEMU cannot open the taps of bridge or ovs NICs (they live in the
// host's namespace), so the two do not mix.
func checkNetns(nics []NIC, fail func(i int, field, format string, args ...any) error) error {
	taps := map[string]int{}
	cni, hostTap := -1, -1
	for i, n := range nics {
		if !n.UsesTap() {
			continue
		}
		if j, dup := taps[n.Tap]; dup {
			return fail(i, "tap", "nic %q: tap %q is also the tap of nic[%d] %q", n.Name, n.Tap, j, nics[j].Name)
		}
		taps[n.Tap] = i
		if n.Type == NICCNI && cni < 0 {
			cni = i
		}
		if n.Type != NICCNI && hostTap < 0 {
			hostTap = i
		}
	}
	if cni >= 0 && hostTap >= 0 {
		i := max(cni, hostTap)
		return fail(i, "type", "nic %q: a VM with a cni NIC (nic[%d] %q) runs in its own network namespace and cannot also have bridge or ovs NICs (nic[%d] %q)",
			nics[i].Name, cni, nics[cni].Name, hostTap, nics[hostTap].Name)
	}
	return nil
}

// CheckNICs runs the cross-NIC checks on a VM's NICs (for a hot-plugged NIC
// appended to them); the error names the NIC.
func CheckNICs(nics []NIC) error {
	return checkNetns(nics, func(i int, field, format string, args ...any) error {
		return fmt.Errorf("nic[%d].%s: %s", i, field, fmt.Sprintf(format, args...))
	})
}

// checkManaged checks the fields of a NIC on a managed network: they are
// used by type "network" only.
func (n *NIC) checkManaged() (string, error) {
	if n.Type != NICNetwork {
		switch {
		case n.Network != "":
			return "network", fmt.Errorf("is used by type \"network\" only, not %q", n.Type)
		case n.IP != "":
			return "ip", fmt.Errorf("is used by type \"network\" only (a static DHCP lease on a managed network)")
		case n.AllowSpoofing:
			return "allow_spoofing", fmt.Errorf("is used by type \"network\" only")
		case len(n.SecurityGroups) > 0:
			return "security_groups", fmt.Errorf("are used by type \"network\" only")
		}
		return "", nil
	}
	if n.Network == "" {
		return "network", fmt.Errorf("type \"network\" needs network (the name of a network made by vmsup network create)")
	}
	if err := ValidName(n.Network); err != nil {
		return "network", err
	}
	if n.IP != "" {
		ip := net.ParseIP(n.IP)
		if ip == nil || ip.To4() == nil {
			return "ip", fmt.Errorf("%q is not an IPv4 address", n.IP)
		}
	}
	seen := map[string]bool{}
	for _, g := range n.SecurityGroups {
		if seen[g] {
			return "security_groups", fmt.Errorf("security group %q is named twice", g)
		}
		seen[g] = true
	}
	return "", nil
}
