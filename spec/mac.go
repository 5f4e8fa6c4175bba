package spec

import (
	"crypto/sha256"
	"fmt"
	"net"
	"strconv"
)

// DeriveMAC returns a stable, locally administered MAC in QEMU's 52:54:00
// range for NIC index i of the VM named name, so a VM keeps its MACs (and its
// DHCP leases) across restarts without the user writing them down.
func DeriveMAC(name string, i int) string {
	h := sha256.Sum256([]byte(name + "/" + strconv.Itoa(i)))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
}

func validMAC(s string) error {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return fmt.Errorf("invalid MAC address %q", s)
	}
	if hw[0]&1 == 1 {
		return fmt.Errorf("MAC address %q is multicast", s)
	}
	return nil
}
