package qemuargs

import (
	"fmt"
	"net"

	"github.com/vmsup/vmsup/spec"
)

// Netdev is one network backend. Its JSON encoding is both the value of
// -netdev on the command line (QEMU 7.2 takes JSON there) and the arguments
// object of QMP netdev_add.
type Netdev struct {
	Type    string         `json:"type"` // "user"
	ID      string         `json:"id"`
	Hostfwd []NetdevString `json:"hostfwd,omitempty"` // user: host forwards
}

// NetdevString is QAPI's String wrapper ({"str": ...}), the element type of
// the user netdev's hostfwd list.
type NetdevString struct {
	Str string `json:"str"`
}

// Args renders the backend for the command line: -netdev JSON.
func (n Netdev) Args() ([]string, error) {
	j, err := marshalJSON(n)
	if err != nil {
		return nil, fmt.Errorf("netdev %q: %w", n.ID, err)
	}
	return []string{"-netdev", j}, nil
}

// checkNIC validates what NICNetdev and NICDevice rely on; field names are
// relative to the NIC ("mac").
func checkNIC(n spec.NIC) *Error {
	obj := fmt.Sprintf("nic %q", n.Name)
	fail := func(field, format string, args ...any) *Error {
		e := errorf(field, format, args...)
		e.Object = obj
		return e
	}
	if err := spec.ValidName(n.Name); err != nil {
		return fail("name", "%v", err)
	}
	if n.Type != spec.NICUser {
		return fail("type", "unsupported NIC type %q (want %q)", n.Type, spec.NICUser)
	}
	if _, err := parseMAC(n.MAC); err != nil {
		return fail("mac", "%v", err)
	}
	for i, fw := range n.Forwards {
		if err := spec.ValidForward(fw); err != nil {
			return fail(fmt.Sprintf("forwards[%d]", i), "%v", err)
		}
	}
	return nil
}

// NICNetdev returns the NIC's backend (id NetdevID). Errors are *Error with
// Object naming the NIC.
func NICNetdev(n spec.NIC) (Netdev, error) {
	if e := checkNIC(n); e != nil {
		return Netdev{}, e
	}
	nd := Netdev{Type: n.Type, ID: NetdevID(n.Name)}
	for _, fw := range n.Forwards {
		nd.Hostfwd = append(nd.Hostfwd, NetdevString{fw})
	}
	return nd, nil
}

// NICDevice returns the NIC's virtio-net-pci device on bus (a root port id
// on q35, "pci.0" on pc; Build also sets Addr on pc), without an option ROM:
// the guests vmsup runs do not PXE-boot, and skipping iPXE saves boot time.
// It assumes n passed NICNetdev; call that first.
func NICDevice(n spec.NIC, bus string) Device {
	noROM := ""
	mac, err := parseMAC(n.MAC)
	if err != nil {
		mac = n.MAC // NICNetdev reports it
	}
	return Device{
		Driver:  "virtio-net-pci",
		ID:      NICDeviceID(n.Name),
		Bus:     bus,
		Netdev:  NetdevID(n.Name),
		MAC:     mac,
		ROMFile: &noROM,
	}
}

// parseMAC checks a unicast Ethernet MAC and returns it in the only form
// QEMU's mac property takes: six lower-case hex pairs separated by colons.
func parseMAC(s string) (string, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("invalid MAC address %q", s)
	}
	if hw[0]&1 == 1 {
		return "", fmt.Errorf("MAC address %q is multicast", s)
	}
	return hw.String(), nil
}
