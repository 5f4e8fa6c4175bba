package stats

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// TapCounters reads the host tap (or any link) ifname's counters through
// h, or through the current network namespace when h is nil, and returns
// them from the guest's point of view: the guest receives what the tap
// transmits and sends what it receives, so rx and tx are swapped. The
// result has HostIf set; the caller names the guest-side NIC.
func TapCounters(h *netlink.Handle, ifname string) (NIC, error) {
	var (
		link netlink.Link
		err  error
	)
	if h == nil {
		link, err = netlink.LinkByName(ifname)
	} else {
		link, err = h.LinkByName(ifname)
	}
	if err != nil {
		return NIC{}, fmt.Errorf("tap %s: %w", ifname, err)
	}
	st := link.Attrs().Statistics
	if st == nil {
		return NIC{}, fmt.Errorf("tap %s: the kernel reported no statistics", ifname)
	}
	return NIC{
		HostIf:    ifname,
		RxBytes:   st.TxBytes,
		TxBytes:   st.RxBytes,
		RxPackets: st.TxPackets,
		TxPackets: st.RxPackets,
		RxDropped: st.TxDropped,
		TxDropped: st.RxDropped,
	}, nil
}
