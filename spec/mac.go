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

// AllocMAC picks the MAC of a NIC added to VM vm after it started: derived
// from the VM's and the NIC's names (so the same NIC gets the same MAC
// again), and never one that taken reports in use; a collision moves to the
// next candidate. Boot NICs keep DeriveMAC's index-based MACs.
func AllocMAC(vm, nic string, taken func(mac string) bool) string {
	for i := 0; ; i++ {
		h := sha256.Sum256([]byte(vm + "/nic/" + nic + "/" + strconv.Itoa(i)))
		mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
		if !taken(mac) {
			return mac
		}
	}
}
