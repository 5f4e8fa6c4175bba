package caps

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// MachineType is the versioned machine type this QEMU runs for name: an
// alias resolved ("q35" -> "pc-q35-7.2"), a versioned type it offers as it
// is. The error names the types of the family it does offer. A record
// without QEMU's machine list (a test's) takes name as it is.
func (c *Caps) MachineType(name string) (string, error) {
	if len(c.QEMU.Machines) == 0 {
		return name, nil
	}
	if v, ok := c.QEMU.Aliases[name]; ok {
		return v, nil
	}
	if slices.Contains(c.QEMU.Machines, name) {
		return name, nil
	}
	offered := c.MachineVersions(spec.MachineFamily(name))
	if len(offered) > 4 {
		offered = offered[:4]
	}
	hint := ""
	if len(offered) > 0 {
		hint = " (it offers " + strings.Join(offered, ", ") + ", ...)"
	}
	return "", fmt.Errorf("QEMU %s has no machine type %q%s", c.QEMU.Version, name, hint)
}

// MachineVersions are the versioned types of a family ("q35" or "pc")
// this QEMU offers, newest first.
func (c *Caps) MachineVersions(family string) []string {
	var out []string
	for _, m := range c.QEMU.Machines {
		if spec.MachineVersioned(m) && spec.MachineFamily(m) == family {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return compareVersions(machineVersion(b), machineVersion(a)) })
	return out
}

// machineVersion is X.Y of pc-q35-X.Y as numbers.
func machineVersion(m string) [2]int {
	v := m[strings.LastIndexByte(m, '-')+1:]
	major, minor, _ := strings.Cut(v, ".")
	a, _ := strconv.Atoi(major)
	b, _ := strconv.Atoi(minor)
	return [2]int{a, b}
}

func compareVersions(a, b [2]int) int {
	if a[0] != b[0] {
		return a[0] - b[0]
	}
	return a[1] - b[1]
}

// HasDevice reports whether QEMU offers the device type (true when the
// record has no device list: a test's, or an older probe's).
func (c *Caps) HasDevice(name string) bool {
	return len(c.QEMU.Devices) == 0 || slices.Contains(c.QEMU.Devices, name)
}

// CheckDevice refuses a device of f's field (driver: QEMU's name for it,
// from qemuargs) that this QEMU's build lacks, before QEMU does at start
// ("'qxl-vga' is not a valid device model name"): Debian's QEMU 10 ships
// qxl in another package.
func (c *Caps) CheckDevice(f *spec.File, field, value, driver string) error {
	if driver != "" && !c.HasDevice(driver) {
		return f.Errorf(field, "%q needs QEMU's %s device, which QEMU %s here does not offer (-device help)", value, driver, c.QEMU.Version)
	}
	return nil
}
