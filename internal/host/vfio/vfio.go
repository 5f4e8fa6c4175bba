// Package vfio owns the host side of PCI passthrough (VFIO): finding a PCI
// device and its IOMMU group in sysfs, checking that the group can be given
// to a guest, binding the device to vfio-pci and giving it back to the
// driver it had, and naming the /dev/vfio nodes QEMU opens. It reads and
// writes only under the sysfs and /dev roots it is given, so tests run it
// against a fake tree. It does not render QEMU's device (qemuargs does),
// keep records or decide when to bind (the supervisor does).
package vfio

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DriverVFIO is the driver a device is given to QEMU through.
const DriverVFIO = "vfio-pci"

// driverStub is the host's other "holds the device for nobody" driver: a
// group member on it is as safe as one on vfio-pci.
const driverStub = "pci-stub"

// Sentinels a caller may branch on; errors wrap them.
var (
	ErrNotFound = errors.New("no such PCI device on this host")
	ErrNoIOMMU  = errors.New("no IOMMU group (the host has no IOMMU enabled: intel_iommu=on / amd_iommu)")
	ErrNoDriver = errors.New("the vfio-pci driver is not loaded (modprobe vfio-pci)")
	ErrBusy     = errors.New("its IOMMU group holds devices in use by the host")
)

// Host is one host's sysfs and /dev. The zero value is "/sys" and "/dev"
// with real writes.
type Host struct {
	Sys string // sysfs mount point; "" is "/sys"
	Dev string // devtmpfs mount point; "" is "/dev"
	// Write writes value to a sysfs attribute; nil is a plain write. A
	// test gives a fake kernel that records the writes and moves the
	// driver links as the kernel would.
	Write func(path, value string) error
}

func (h Host) sys(parts ...string) string {
	return filepath.Join(append([]string{cmp.Or(h.Sys, "/sys")}, parts...)...)
}

func (h Host) dev(parts ...string) string {
	return filepath.Join(append([]string{cmp.Or(h.Dev, "/dev")}, parts...)...)
}

func (h Host) write(path, value string) error {
	if h.Write != nil {
		return h.Write(path, value)
	}
	// O_WRONLY without O_CREATE or O_TRUNC: a sysfs attribute exists or
	// the write is wrong.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", strings.TrimSpace(value), path, err)
	}
	return f.Close()
}

// deviceDir is the device's sysfs directory.
func (h Host) deviceDir(addr string) string { return h.sys("bus", "pci", "devices", addr) }

// exists reports whether the PCI device addr is on the host.
func (h Host) exists(addr string) error {
	if _, err := os.Stat(h.deviceDir(addr)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w (no %s)", ErrNotFound, h.deviceDir(addr))
		}
		return err
	}
	return nil
}

// Driver is the driver the device addr is bound to, "" for none.
func (h Host) Driver(addr string) (string, error) {
	link, err := os.Readlink(filepath.Join(h.deviceDir(addr), "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(link), nil
}

// Group is the IOMMU group number of the device addr.
func (h Host) Group(addr string) (string, error) {
	if err := h.exists(addr); err != nil {
		return "", err
	}
	link, err := os.Readlink(filepath.Join(h.deviceDir(addr), "iommu_group"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", ErrNoIOMMU
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(link), nil
}

// isBridge reports whether addr is a PCI-to-PCI bridge (class 0x0604): a
// bridge in a group stays with the host's PCI core, as vfio allows.
func (h Host) isBridge(addr string) bool {
	b, err := os.ReadFile(filepath.Join(h.deviceDir(addr), "class"))
	return err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), "0x0604")
}

// Check reports whether the device addr can be passed through, touching
// nothing: it exists, it has an IOMMU group, vfio-pci is loaded, and every
// other device of its group (bridges aside) is one of with (the other
// devices the VM takes), unbound, or on vfio-pci or pci-stub. A busy group
// is refused with the list of its busy devices and their drivers.
func (h Host) Check(addr string, with []string) error {
	group, err := h.Group(addr)
	if err != nil {
		return err
	}
	if h.isBridge(addr) {
		return errors.New("a PCI bridge, which cannot be passed through")
	}
	if _, err := os.Stat(h.sys("bus", "pci", "drivers", DriverVFIO)); err != nil {
		return ErrNoDriver
	}
	members, err := h.GroupDevices(group)
	if err != nil {
		return err
	}
	var busy []string
	for _, m := range members {
		if m == addr || slices.Contains(with, m) || h.isBridge(m) {
			continue
		}
		drv, err := h.Driver(m)
		if err != nil {
			return err
		}
		if drv != "" && drv != DriverVFIO && drv != driverStub {
			busy = append(busy, fmt.Sprintf("%s (%s)", m, drv))
		}
	}
	if len(busy) > 0 {
		return fmt.Errorf("%w: IOMMU group %s: %s; pass them through too, or unbind them", ErrBusy, group, strings.Join(busy, ", "))
	}
	return nil
}

// GroupDevices lists the PCI addresses in IOMMU group group, sorted.
func (h Host) GroupDevices(group string) ([]string, error) {
	ents, err := os.ReadDir(h.sys("kernel", "iommu_groups", group, "devices"))
	if err != nil {
		return nil, fmt.Errorf("IOMMU group %s: %w", group, err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, nil
}

// Nodes are the device nodes QEMU opens for the devices addrs: the VFIO
// container and each group's node, without repeats.
func (h Host) Nodes(addrs []string) ([]string, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	out := []string{h.dev("vfio", "vfio")}
	for _, a := range addrs {
		g, err := h.Group(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a, err)
		}
		if n := h.dev("vfio", g); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Available reports why this host cannot pass PCI devices through, or nil
// when it can: IOMMU groups, the vfio-pci driver and /dev/vfio/vfio.
func (h Host) Available() error {
	groups, err := os.ReadDir(h.sys("kernel", "iommu_groups"))
	if err != nil || len(groups) == 0 {
		return fmt.Errorf("no IOMMU groups in %s: %w", h.sys("kernel", "iommu_groups"), ErrNoIOMMU)
	}
	if _, err := os.Stat(h.sys("bus", "pci", "drivers", DriverVFIO)); err != nil {
		return ErrNoDriver
	}
	if _, err := os.Stat(h.dev("vfio", "vfio")); err != nil {
		return fmt.Errorf("no %s (modprobe vfio)", h.dev("vfio", "vfio"))
	}
	return nil
}
