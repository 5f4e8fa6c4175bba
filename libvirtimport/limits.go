package libvirtimport

import (
	"fmt"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// fitLayout keeps the devices that take a PCI place (NICs, disks but
// SATA ones, host devices, vsock) within what vmsup lays out: q35's root
// ports less the hotplug slots, or pc's slots. Disks go first (from the
// last), then NICs, each range with one line: a domain of 10 000 disks
// imports with the disks that fit.
func (c *converter) fitLayout() {
	room := qemuargs.MaxRootPorts - spec.DefaultHotplugSlots
	where := fmt.Sprintf("q35 has %d root ports, %d of them kept for hotplug", qemuargs.MaxRootPorts, spec.DefaultHotplugSlots)
	if c.out.Machine == "pc" {
		room, where = qemuargs.MaxPCSlots, fmt.Sprintf("pc has %d PCI slots", qemuargs.MaxPCSlots)
	}
	room -= len(c.out.HostDevs)
	if c.out.Vsock != nil {
		room--
	}
	room -= len(c.out.NICs)
	if room < 0 {
		keep := len(c.out.NICs) + room
		c.trimmed("interface", c.out.NICs[keep].el, c.out.NICs[len(c.out.NICs)-1].el, len(c.out.NICs)-keep, where)
		c.out.NICs = c.out.NICs[:keep]
		room = 0
	}
	var kept, out []fileDisk
	sataAfter := false // a SATA disk kept among the ones taken out
	for _, d := range c.out.Disks {
		switch {
		case d.Bus == spec.BusSATA:
			kept = append(kept, d)
			sataAfter = sataAfter || len(out) > 0
		case room > 0:
			room--
			kept = append(kept, d)
		default:
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return
	}
	c.out.Disks = kept
	if sataAfter {
		for _, d := range out {
			c.drop(d.el, "more than vmsup places: %s", where)
		}
		return
	}
	c.trimmed("disk", out[0].el, out[len(out)-1].el, len(out), where)
}

// trimmed drops the devices from the one at first to the one at last
// (their elements) with one line.
func (c *converter) trimmed(kind, first, last string, n int, where string) {
	lo, hi := parsePath(first), parsePath(last)
	if len(lo) < 2 || len(hi) < 2 {
		return
	}
	el := fmt.Sprintf("devices/%s[%d..%d]", kind, lo[1].lo, hi[1].lo)
	c.drop(el, "%d more than vmsup places: %s (the devices of a VM that fit are carried over)", n, where)
}
