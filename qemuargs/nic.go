package qemuargs

import (
	"errors"
	"fmt"
	"net"

	"github.com/vmsup/vmsup/spec"
)

// Netdev is one network backend. Its JSON encoding is both the value of
// -netdev on the command line (QEMU 7.2 takes JSON there) and the arguments
// object of QMP netdev_add.
type Netdev struct {
	Type    string         `json:"type"` // "user" or "tap"
	ID      string         `json:"id"`
	Hostfwd []NetdevString `json:"hostfwd,omitempty"` // user: host forwards

	// tap: QEMU opens the persistent tap vmsup made by name (TUNSETIFF on
	// /dev/net/tun); script and downscript are "no" because vmsup, not
	// QEMU, wires the tap.
	Ifname     string `json:"ifname,omitempty"`
	Script     string `json:"script,omitempty"`
	Downscript string `json:"downscript,omitempty"`
	Vhost      *bool  `json:"vhost,omitempty"`
	Queues     int    `json:"queues,omitempty"` // > 1 only: the tap is multi-queue
	SndBuf     int64  `json:"sndbuf,omitempty"` // the tap's send buffer, bytes; 0: the kernel's
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
	if field, err := n.Check(); err != nil {
		return fail(field, "%v", err)
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

// NICNetdev returns the NIC's backend (id NetdevID). vhostNet says whether
// the host has /dev/vhost-net: vhost "auto" uses it then, and vhost "on"
// without it is an error here rather than a QEMU abort. Errors are *Error
// with Object naming the NIC.
func NICNetdev(n spec.NIC, vhostNet bool) (Netdev, error) {
	if e := checkNIC(n); e != nil {
		return Netdev{}, e
	}
	if !n.UsesTap() {
		nd := Netdev{Type: n.Type, ID: NetdevID(n.Name)}
		for _, fw := range n.Forwards {
			nd.Hostfwd = append(nd.Hostfwd, NetdevString{fw})
		}
		return nd, nil
	}
	vhost := vhostNet
	switch n.Vhost {
	case spec.VhostOn:
		if !vhostNet {
			e := errorf("vhost", "vhost \"on\" needs /dev/vhost-net, which this host does not have (use \"auto\" or \"off\")")
			e.Object = fmt.Sprintf("nic %q", n.Name)
			return Netdev{}, e
		}
		vhost = true
	case spec.VhostOff:
		vhost = false
	}
	nd := Netdev{Type: "tap", ID: NetdevID(n.Name), Ifname: n.Tap, Script: "no", Downscript: "no", Vhost: &vhost, SndBuf: int64(n.SndBuf)}
	if n.Queues > 1 {
		nd.Queues = n.Queues
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
	d := Device{
		Driver:  "virtio-net-pci",
		ID:      NICDeviceID(n.Name),
		Bus:     bus,
		Netdev:  NetdevID(n.Name),
		MAC:     mac,
		ROMFile: &noROM,
		HostMTU: n.MTU,
		// Queue sizes: 0 leaves QEMU's 256.
		RxQueueSize: n.RxQueueSize,
		TxQueueSize: n.TxQueueSize,
	}
	if n.Model == spec.NICModelE1000e {
		d.Driver, d.HostMTU, d.RxQueueSize, d.TxQueueSize = "e1000e", 0, 0, 0 // no virtio-net properties (spec.NIC.Check)
		return d
	}
	if n.Queues > 1 {
		// One vector per queue (rx and tx) plus config and control, as
		// QEMU's documentation for multiqueue virtio-net says.
		mq := true
		d.MQ, d.Vectors = &mq, 2*n.Queues+2
	}
	return d
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

// nicInField is inField for the i-th NIC, keeping the NIC's name in the
// message: "nic[0].vhost: nic \"lan\": ...".
func nicInField(err error, i int, name string) error {
	err = inField(err, fmt.Sprintf("nic[%d]", i))
	var e *Error
	if errors.As(err, &e) {
		e.Msg = fmt.Sprintf("nic %q: %s", name, e.Msg)
	}
	return err
}
