package spec

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// HostDev is a host PCI device given whole to the guest through VFIO
// (QEMU's vfio-pci, on its own root port on q35). vmsup binds it to
// vfio-pci before QEMU starts and gives it back to its previous driver at
// down; every device in its IOMMU group must be free of host drivers.
type HostDev struct {
	// Address is the device's PCI address, "0000:01:00.0" or "01:00.0"
	// (domain 0000); Load writes it in the full, lower-case form.
	Address string `toml:"address"`
	// Name is the source of the device id ("hostdev-NAME"); default
	// "pci-" and the address with '-' for ':' ("pci-0000-01-00.0").
	Name string `toml:"name"`
	// ROMBar exposes the device's option ROM to the guest; default QEMU's
	// (on). Off for a GPU whose ROM the guest must not run.
	ROMBar *bool `toml:"rom_bar"`
}

// MaxHostDevs bounds [[hostdev]] (each takes a root port).
const MaxHostDevs = 32

var pciAddrRE = regexp.MustCompile(`^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$`)

// ParsePCIAddress checks a PCI address ("DDDD:BB:SS.F" or "BB:SS.F") and
// returns it in the form sysfs and QEMU use: a domain, lower case.
func ParsePCIAddress(s string) (string, error) {
	m := pciAddrRE.FindStringSubmatch(s)
	if m == nil {
		return "", fmt.Errorf("%q is not a PCI address (\"0000:01:00.0\" or \"01:00.0\")", s)
	}
	if slot, _ := strconv.ParseUint(m[3], 16, 8); slot > 0x1f { // two hex digits: always parses
		return "", fmt.Errorf("%q: slot %s is beyond 1f", s, m[3])
	}
	dom := m[1]
	if dom == "" {
		dom = "0000"
	}
	return strings.ToLower(fmt.Sprintf("%s:%s:%s.%s", dom, m[2], m[3], m[4])), nil
}

// HostDevName is the default name of the host device at addr.
func HostDevName(addr string) string { return "pci-" + strings.ReplaceAll(addr, ":", "-") }

func (h *HostDev) applyDefaults() {
	if a, err := ParsePCIAddress(h.Address); err == nil {
		h.Address = a // validateHostDevs reports a bad one
	}
	if h.Name == "" && h.Address != "" {
		h.Name = HostDevName(h.Address)
	}
}

func (f *File) validateHostDevs() error {
	devs := f.VM.HostDevs
	if len(devs) > MaxHostDevs {
		return f.Errorf("hostdev", "%d devices, at most %d", len(devs), MaxHostDevs)
	}
	addrs, names := map[string]int{}, map[string]int{}
	for i, h := range devs {
		field := fmt.Sprintf("hostdev[%d]", i)
		if h.Address == "" {
			return f.Errorf(field+".address", "missing (the device's PCI address, e.g. \"0000:01:00.0\")")
		}
		a, err := ParsePCIAddress(h.Address)
		if err != nil {
			return f.Errorf(field+".address", "%v", err)
		}
		if j, dup := addrs[a]; dup {
			return f.Errorf(field+".address", "%s is also hostdev[%d]", a, j)
		}
		addrs[a] = i
		if err := ValidName(h.Name); err != nil {
			return f.Errorf(field+".name", "%v", err)
		}
		if j, dup := names[h.Name]; dup {
			return f.Errorf(field+".name", "duplicate hostdev name %q (also hostdev[%d])", h.Name, j)
		}
		names[h.Name] = i
	}
	return nil
}
