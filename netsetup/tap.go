package netsetup

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// Tap is a persistent tap device for one NIC.
type Tap struct {
	Name string
	// Owner and Group may open the tap (TUNSETOWNER/TUNSETGROUP): the user
	// QEMU runs as. The kernel enforces it for users without CAP_NET_ADMIN.
	Owner, Group uint32
	MTU          int              // 0: leave the kernel's default (or the bridge's, see AttachBridge)
	GuestMAC     net.HardwareAddr // the guest's MAC; the tap gets it with the first byte 0xfe
	Queues       int              // > 1: a multi-queue tap (QEMU opens it with queues=N)
}

// TapMAC is the host-side MAC of the tap for a guest MAC: the same with the
// first byte 0xfe (as libvirt does), so the tap never answers for the
// guest's address and a bridge does not adopt a low MAC from a tap.
func TapMAC(guest net.HardwareAddr) net.HardwareAddr {
	if len(guest) != 6 {
		return nil
	}
	m := append(net.HardwareAddr(nil), guest...)
	m[0] = 0xfe
	return m
}

// ErrExists means a link with the requested name is already there.
var ErrExists = errors.New("link exists")

// CreateTap makes t in the calling thread's network namespace and sets it
// up. A link with the same name is an error wrapping ErrExists (the caller
// decides whether it is a stale tap to remove). On failure nothing is left.
func CreateTap(t Tap) error {
	if _, err := netlink.LinkByName(t.Name); err == nil {
		return fmt.Errorf("tap %s: %w", t.Name, ErrExists)
	}
	flags := netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR
	if t.Queues > 1 {
		flags |= netlink.TUNTAP_MULTI_QUEUE
	}
	// Queues 0: netlink opens one fd, makes the tap persistent and closes
	// it, so the tap outlives vmsup and QEMU opens it by name.
	link := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: t.Name},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Flags:     flags,
		Owner:     t.Owner,
		Group:     t.Group,
	}
	if err := netlink.LinkAdd(link); err != nil {
		return fmt.Errorf("tap %s: create: %w", t.Name, err)
	}
	err := func() error {
		l, err := netlink.LinkByName(t.Name)
		if err != nil {
			return err
		}
		if t.MTU > 0 {
			if err := netlink.LinkSetMTU(l, t.MTU); err != nil {
				return fmt.Errorf("set MTU %d: %w", t.MTU, err)
			}
		}
		if mac := TapMAC(t.GuestMAC); mac != nil {
			if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
				return fmt.Errorf("set MAC %s: %w", mac, err)
			}
		}
		return netlink.LinkSetUp(l)
	}()
	if err != nil {
		DeleteTap(t.Name)
		return fmt.Errorf("tap %s: %w", t.Name, err)
	}
	return nil
}

// DeleteLink removes the link called name; a missing one is not an error.
func DeleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("link %s: delete: %w", name, err)
	}
	return nil
}

// DeleteTap removes the tap called name; a missing one is not an error,
// and a link of that name that is not a tap is left alone (an error), so a
// tap name that collides with a bridge or NIC can never remove it.
func DeleteTap(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("tap %s: %w", name, err)
	}
	if _, ok := l.(*netlink.Tuntap); !ok {
		return fmt.Errorf("tap %s: the link of that name is a %s, not a tap; left alone", name, l.Type())
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("tap %s: delete: %w", name, err)
	}
	return nil
}

// IsTap reports whether the link called name exists and is a tap (or tun).
func IsTap(name string) bool {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return false
	}
	_, ok := l.(*netlink.Tuntap)
	return ok
}

// LinkExists reports whether a link called name exists in the calling
// thread's namespace.
func LinkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}

// CheckBridge returns the MTU of the Linux bridge called name, or an error
// saying it is missing or not a bridge.
func CheckBridge(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return 0, fmt.Errorf("no Linux bridge %q on this host", name)
		}
		return 0, fmt.Errorf("bridge %q: %w", name, err)
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return 0, fmt.Errorf("%q is a %s link, not a Linux bridge", name, l.Type())
	}
	return l.Attrs().MTU, nil
}

// AttachBridge makes the tap a port of the Linux bridge.
func AttachBridge(tap, bridge string) error {
	t, err := netlink.LinkByName(tap)
	if err != nil {
		return fmt.Errorf("tap %s: %w", tap, err)
	}
	b, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", bridge, err)
	}
	if err := netlink.LinkSetMaster(t, b); err != nil {
		return fmt.Errorf("tap %s: attach to bridge %s: %w", tap, bridge, err)
	}
	return nil
}

// LinkMaster returns the name of the bridge link name is attached to ("" if
// none).
func LinkMaster(name string) (string, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return "", err
	}
	if l.Attrs().MasterIndex == 0 {
		return "", nil
	}
	m, err := netlink.LinkByIndex(l.Attrs().MasterIndex)
	if err != nil {
		return "", err
	}
	return m.Attrs().Name, nil
}
