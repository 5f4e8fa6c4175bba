package libvirtimport

import (
	"fmt"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// fitLayout refuses a domain whose devices that take a PCI place (NICs,
// disks but SATA ones, host devices, vsock) are more than vmsup lays
// out: q35's root ports less the hotplug slots, or pc's slots. A VM
// without some of its disks or NICs would be another VM, so the import
// stops with the limit instead of carrying a part of them.
func (c *converter) fitLayout() error {
	room := qemuargs.MaxRootPorts - spec.DefaultHotplugSlots
	where := fmt.Sprintf("q35 has %d root ports, %d of them kept for hotplug", qemuargs.MaxRootPorts, spec.DefaultHotplugSlots)
	if c.onPC() {
		room, where = qemuargs.MaxPCSlots, fmt.Sprintf("pc has %d PCI slots", qemuargs.MaxPCSlots)
	}
	disks := 0
	for _, d := range c.out.Disks {
		if d.Bus != spec.BusSATA {
			disks++
		}
	}
	other := len(c.out.HostDevs)
	if c.out.Vsock != nil {
		other++
	}
	need := disks + len(c.out.NICs) + other
	if need <= room {
		return nil
	}
	el := "devices/disk"
	if len(c.out.NICs)+other > room {
		el = "devices/interface"
	}
	return fmt.Errorf("%s: %d disks (SATA ones aside), %d NICs and %d other PCI devices need %d PCI places; vmsup lays out at most %d (%s)",
		el, disks, len(c.out.NICs), other, need, room, where)
}
