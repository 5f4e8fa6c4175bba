// Package devices adds and removes devices of a running QEMU over QMP: a
// disk's parts (objects, block nodes, devices) built by qemuargs exactly as
// at boot, a block device passed as a descriptor, free hotplug root ports,
// vCPUs and DIMMs within the VM's ceilings, and the one unplug that waits
// for the guest to release a device. It decides nothing about records or
// confinement: the supervisor orchestrates around it.
package qdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"
	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// PlugDisk is the steps that add a disk's parts in order (objects, block nodes, devices),
// each with its Undo: removing the PCI device removes what sits on it.
func PlugDisk(c *qmp.Conn, disk string, p qemuargs.DiskParts, unplugTimeout time.Duration) []steps.Step {
	var list []steps.Step
	for _, o := range p.Objects {
		list = append(list, steps.Step{Name: fmt.Sprintf("disk %q: object-add %s", disk, o.ID), Do: func(ctx context.Context) error {
			if err := c.ObjectAdd(ctx, o); err != nil {
				return fmt.Errorf("object-add %s: %w", o.ID, err)
			}
			return nil
		}, Undo: func(ctx context.Context) { _ = c.ObjectDel(ctx, o.ID) }})
	}
	for _, b := range p.Blockdevs {
		list = append(list, steps.Step{Name: fmt.Sprintf("disk %q: blockdev-add %s", disk, b.NodeName), Do: func(ctx context.Context) error {
			if err := c.BlockdevAdd(ctx, b); err != nil {
				return fmt.Errorf("blockdev-add %s: %w", b.NodeName, err)
			}
			return nil
		}, Undo: func(ctx context.Context) { _ = c.BlockdevDel(ctx, b.NodeName) }})
	}
	for i, d := range p.Devices {
		st := steps.Step{Name: fmt.Sprintf("disk %q: device_add %s", disk, d.ID), Do: func(ctx context.Context) error {
			if err := c.DeviceAdd(ctx, d); err != nil {
				return fmt.Errorf("device_add %s: %w", d.ID, err)
			}
			return nil
		}}
		if i == 0 {
			st.Undo = func(ctx context.Context) { _ = Unplug(ctx, c, "disk", d.ID, unplugTimeout) }
		}
		list = append(list, st)
	}
	return list
}

// UnplugDisk removes the parts: the PCI device (and what sits on it), then
// the nodes, top first, then the objects.
func UnplugDisk(ctx context.Context, c *qmp.Conn, p qemuargs.DiskParts, timeout time.Duration) error {
	if len(p.Devices) > 0 {
		if err := Unplug(ctx, c, "disk", p.Devices[0].ID, timeout); err != nil {
			return err
		}
	}
	var errs []error
	for i := len(p.Blockdevs) - 1; i >= 0; i-- {
		if err := blockdevDel(ctx, c, p.Blockdevs[i].NodeName); err != nil {
			errs = append(errs, fmt.Errorf("blockdev-del %s: %w", p.Blockdevs[i].NodeName, err))
		}
	}
	for i := len(p.Objects) - 1; i >= 0; i-- {
		if err := c.ObjectDel(ctx, p.Objects[i].ID); err != nil {
			errs = append(errs, fmt.Errorf("object-del %s: %w", p.Objects[i].ID, err))
		}
	}
	return errors.Join(errs...)
}

// blockdevDel deletes a node, trying again for a moment while QEMU says it
// is in use: after DEVICE_DELETED the device's block backend can hold it a
// little longer (requests a guest resumed just before are still draining).
func blockdevDel(ctx context.Context, c *qmp.Conn, node string) error {
	for wait := 50 * time.Millisecond; ; wait *= 2 {
		err := c.BlockdevDel(ctx, node)
		if err == nil || !strings.Contains(err.Error(), "in use") || wait > 2*time.Second {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// Unplug asks the guest to release device id and waits for
// DEVICE_DELETED.
// what names the device in the error ("disk", "NIC", "DIMM").
func Unplug(ctx context.Context, c *qmp.Conn, what, id string, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sub, unsub := c.Subscribe(wctx)
	defer unsub()
	if err := c.DeviceDel(ctx, id); err != nil {
		if qmp.IsClass(err, qmp.ClassDeviceNotFound) {
			// Already gone: a guest that released it after an earlier
			// detach timed out.
			return nil
		}
		return fmt.Errorf("device_del %s: %w", id, err)
	}
	_, err := qmp.WaitEvent(wctx, sub, "DEVICE_DELETED", func(ev goqmp.Event) bool {
		dev, _ := ev.Data["device"].(string)
		return dev == id
	})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("the guest did not release device %s within %s (does its OS support PCIe hot-unplug, "+
				"and is the %s unused there?); the %s stays attached", id, timeout, what, what)
		}
		return fmt.Errorf("device %s: %w", id, err)
	}
	return nil
}

// PassBlockDevice opens a block device for QEMU and hands it over (add-fd):
// the running unit may open only the devices it started with (DeviceAllow=
// and PrivateDevices= are fixed at start), and a descriptor is not opened
// again, so QEMU uses /dev/fdset/N instead of the path (as Incus does).
// vmsup's own copy is closed once QEMU holds one.
func PassBlockDevice(ctx context.Context, c *qmp.Conn, d spec.Disk) (int64, error) {
	flags := os.O_RDWR
	if d.ReadOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(d.File, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s for QEMU: %w", d.File, err)
	}
	defer f.Close()
	info, err := c.AddFD(ctx, nil, FDOpaque(d.Name), f)
	if err != nil {
		return 0, fmt.Errorf("pass %s to QEMU (add-fd): %w", d.File, err)
	}
	return info.FDSetID, nil
}

// FreeRootPort returns the first spare root port (as Build laid them out
// at boot: spare, the recorded ports, which count disks carried into the boot spec)
// with nothing behind it, asking QEMU, so that NICs and disks hot-plugged by
// any vmsup command never collide. On pc, devices go on pci.0.
func FreeRootPort(ctx context.Context, c *qmp.Conn, vm *spec.VM, spare []string) (string, error) {
	free, err := FreeRootPorts(ctx, c, vm, spare)
	if err != nil {
		return "", err
	}
	return free[0], nil
}

// FreeRootPorts lists the hotplug root ports no device sits in (pc: its
// root bus, which takes hotplugs itself); an error when there are none.
func FreeRootPorts(ctx context.Context, c *qmp.Conn, vm *spec.VM, spare []string) ([]string, error) {
	if len(spare) == 0 {
		spare = qemuargs.SpareRootPorts(vm)
	}
	if !vm.Q35() {
		return []string{qemuargs.PCIRootBus}, nil
	}
	if len(spare) == 0 {
		return nil, errors.New("no hotplug root ports (hotplug_slots = 0)")
	}
	buses, err := c.QueryPCI(ctx)
	if err != nil {
		return nil, fmt.Errorf("query-pci: %w", err)
	}
	used := map[string]bool{}
	for _, b := range buses {
		for _, d := range b.Devices {
			if d.PCIBridge != nil && len(d.PCIBridge.Devices) > 0 {
				used[d.QdevID] = true
			}
		}
	}
	var free []string
	for _, id := range spare {
		if !used[id] {
			free = append(free, id)
		}
	}
	if len(free) == 0 {
		return nil, fmt.Errorf("all %d hotplug root ports are in use", len(spare))
	}
	return free, nil
}

// FDOpaque is the note on the fd set of disk's block device, by which it is
// found again (query-fdsets).
func FDOpaque(disk string) string { return "vmsup disk " + disk }

// FDChainOpaque is the note on the fd set of level i (0: the image, 1:
// its base) of a disk's chain passed as descriptors (internal/lifecycle/diskfds),
// naming the file: the block nodes on it show only /dev/fdset/N, and the
// disk operations find a node by its image's name (NamedNodes).
func FDChainOpaque(disk string, i int, path string) string {
	if i == 0 {
		return fmt.Sprintf("%s file %s", FDOpaque(disk), path)
	}
	return fmt.Sprintf("%s base %d file %s", FDOpaque(disk), i, path)
}

// FDSetFile is the file an fd set's note names (FDChainOpaque): how a
// node on /dev/fdset/N is told by the image behind it.
func FDSetFile(opaque string) (string, bool) {
	if !strings.HasPrefix(opaque, "vmsup disk ") {
		return "", false
	}
	_, path, ok := strings.Cut(opaque, " file ")
	return path, ok && path != ""
}

// RemoveChain removes what a disk plugged as descriptors keeps beyond its
// top nodes once those are gone: its bases' nodes (qemuargs.ChainNodeName)
// and fd sets, and the top's fd set, but for the sets of the files in keep
// (a move's target, named as the disk's). Idempotent: it removes what
// QEMU has.
func RemoveChain(ctx context.Context, c *qmp.Conn, disk string, keep ...string) error {
	pr, err := Query(ctx, c)
	if err != nil {
		return err
	}
	var errs []error
	// Every level: a merge may have closed some above others.
	for i := 1; i <= maxChain; i++ {
		for _, n := range []string{qemuargs.ChainNodeName(disk, i), qemuargs.ChainFileNodeName(disk, i)} {
			if pr.Nodes[n] {
				if err := blockdevDel(ctx, c, n); err != nil {
					errs = append(errs, fmt.Errorf("blockdev-del %s: %w", n, err))
				}
			}
		}
	}
	for opaque, id := range pr.FDSets {
		if p, ok := FDSetFile(opaque); ok && slices.Contains(keep, p) {
			continue
		}
		if opaque == FDOpaque(disk) || strings.HasPrefix(opaque, FDOpaque(disk)+" base ") || strings.HasPrefix(opaque, FDOpaque(disk)+" file ") {
			errs = append(errs, c.RemoveFD(ctx, id, nil))
		}
	}
	return errors.Join(errs...)
}

// maxChain bounds the levels of a disk's chain (storage.OpenLimits).
const maxChain = 64
