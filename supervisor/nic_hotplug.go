package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// unplugTimeout bounds the wait for the guest to release an unplugged NIC
// (DEVICE_DELETED); a guest that ignores the request fails the detach.
const unplugTimeout = 30 * time.Second

// AttachNIC hot-plugs n into the running VM: the host side exactly as at
// boot (nicUp), then netdev_add and device_add with the values qemuargs
// renders for the command line, into a free spare root port. Defaults are
// filled as for a NIC in the file (MAC from the VM name and the NIC's index
// among all its NICs). The NIC is recorded in state.json (AttachedNICs) and
// net.json, so detach, down and the stop hook remove it. On failure every
// step is undone.
func (s *Supervisor) AttachNIC(ctx context.Context, name string, n spec.NIC) (spec.NIC, error) {
	lk, err := s.lock(ctx, name, "nic-attach")
	if err != nil {
		return n, err
	}
	defer lk.unlock()
	app, vm, err := s.runningSpec(name)
	if err != nil {
		return n, fmt.Errorf("vm %q: %w", name, err)
	}
	all := append(slices.Clone(vm.NICs), app.AttachedNICs...)
	n.ApplyDefaults(vm, len(all))
	fail := func(field string, err error) error {
		return fmt.Errorf("vm %q: nic %q: %s: %w", name, n.Name, field, err)
	}
	if err := spec.ValidName(n.Name); err != nil {
		return n, fail("name", err)
	}
	if field, err := n.Check(); err != nil {
		return n, fail(field, err)
	}
	for _, o := range all {
		if o.Name == n.Name {
			return n, fail("name", errors.New("the VM already has a NIC of this name"))
		}
		if strings.EqualFold(o.MAC, n.MAC) {
			return n, fail("mac", fmt.Errorf("duplicate MAC %s (also nic %q)", n.MAC, o.Name))
		}
	}
	if err := spec.CheckNICs(append(all, n)); err != nil {
		return n, fmt.Errorf("vm %q: %w", name, err)
	}
	vhost := s.vhostNet()
	if err := s.checkNIC(ctx, n, vhost); err != nil {
		var fe *nicFieldError
		if errors.As(err, &fe) {
			return n, fail(fe.field, fe.err)
		}
		return n, fail("type", err)
	}
	nd, err := qemuargs.NICNetdev(n, vhost)
	if err != nil {
		return n, fmt.Errorf("vm %q: %w", name, err)
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return n, err
	}
	defer release()
	bus, err := freeRootPort(ctx, c, vm, app)
	if err != nil {
		return n, fmt.Errorf("vm %q: nic %q: %w", name, n.Name, err)
	}
	dev := qemuargs.NICDevice(n, bus)
	p := s.paths(name)
	st, err := readNetState(p)
	if errors.Is(err, os.ErrNotExist) {
		st, err = &netState{VM: name, CNIBinDirs: s.opts.Network.CNIBinDirs, CNICache: p.cniCache()}, nil
	}
	if err != nil {
		return n, err
	}
	steps := []step{
		{name: fmt.Sprintf("nic %q: tap", n.Name), do: func(ctx context.Context) error {
			if !n.UsesTap() {
				return nil
			}
			return s.nicUp(ctx, name, n, bus, st)
		}, undo: func(ctx context.Context) { s.forgetNIC(ctx, name, n.Name) }},
		{name: fmt.Sprintf("nic %q: netdev_add", n.Name), do: func(ctx context.Context) error {
			return c.NetdevAdd(ctx, nd)
		}, undo: func(ctx context.Context) { _ = c.NetdevDel(ctx, nd.ID) }},
		{name: fmt.Sprintf("nic %q: device_add", n.Name), do: func(ctx context.Context) error {
			return c.DeviceAdd(ctx, dev)
		}},
		{name: fmt.Sprintf("nic %q: record", n.Name), do: func(ctx context.Context) error {
			app.AttachedNICs = append(app.AttachedNICs, n)
			return s.rewriteApplied(app)
		}},
	}
	if err := runSteps(ctx, name, steps, s.opts.AfterStep); err != nil {
		return n, err
	}
	return n, nil
}

// DetachNIC unplugs a hot-plugged NIC: device_del, wait for the guest to
// release it (DEVICE_DELETED), netdev_del, then the host side goes. NICs the
// VM booted with stay: they are part of its file.
func (s *Supervisor) DetachNIC(ctx context.Context, name, nic string) error {
	lk, err := s.lock(ctx, name, "nic-detach")
	if err != nil {
		return err
	}
	defer lk.unlock()
	app, vm, err := s.runningSpec(name)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(app.AttachedNICs, func(n spec.NIC) bool { return n.Name == nic })
	if i < 0 {
		if slices.ContainsFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == nic }) {
			return fmt.Errorf("vm %q: nic %q is in the VM's file, not hot-plugged: remove it there and restart", name, nic)
		}
		return fmt.Errorf("vm %q: no hot-plugged nic %q", name, nic)
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	id := qemuargs.NICDeviceID(nic)
	wctx, cancel := context.WithTimeout(ctx, unplugTimeout)
	defer cancel()
	sub, unsub := c.Subscribe(wctx)
	defer unsub()
	if err := c.DeviceDel(ctx, id); err != nil && !isDeviceNotFound(err) {
		return fmt.Errorf("vm %q: nic %q: device_del: %w", name, nic, err)
	} else if err == nil {
		if _, err := qmp.WaitEvent(wctx, sub, "DEVICE_DELETED", func(ev goqmp.Event) bool {
			return ev.Data["device"] == id
		}); err != nil {
			return fmt.Errorf("vm %q: nic %q: the guest did not release the device: %w", name, nic, err)
		}
	}
	if err := c.NetdevDel(ctx, qemuargs.NetdevID(nic)); err != nil && !isDeviceNotFound(err) {
		return fmt.Errorf("vm %q: nic %q: netdev_del: %w", name, nic, err)
	}
	if err := s.forgetNIC(ctx, name, nic); err != nil {
		return fmt.Errorf("vm %q: %w", name, err)
	}
	app.AttachedNICs = slices.Delete(app.AttachedNICs, i, i+1)
	return s.rewriteApplied(app)
}

// forgetNIC removes a hot-plugged NIC's host side and its net.json entry.
func (s *Supervisor) forgetNIC(ctx context.Context, name, nic string) error {
	p := s.paths(name)
	st, err := readNetState(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	j := slices.IndexFunc(st.NICs, func(n nicState) bool { return n.Name == nic })
	if j < 0 {
		return nil
	}
	if err := s.nicDown(ctx, st, st.NICs[j], false); err != nil {
		return fmt.Errorf("nic %q: %w", nic, err)
	}
	st.NICs = slices.Delete(st.NICs, j, j+1)
	return writeNetState(p, st)
}

func isDeviceNotFound(err error) bool {
	var qe *qmp.Error
	return errors.As(err, &qe) && qe.Class == "DeviceNotFound"
}

// pciDevice is the part of query-pci's reply used to find empty root ports.
type pciDevice struct {
	QdevID    string `json:"qdev_id"`
	PCIBridge *struct {
		Devices []pciDevice `json:"devices"`
	} `json:"pci_bridge,omitempty"`
}

type pciBus struct {
	Bus     int         `json:"bus"`
	Devices []pciDevice `json:"devices"`
}

// freeRootPort returns the first spare root port (as Build laid them out
// at boot: app.HotplugPorts, which counts disks carried into the boot spec)
// with nothing behind it, asking QEMU, so that NICs and disks hot-plugged by
// any vmsup command never collide. On pc, devices go on pci.0.
func freeRootPort(ctx context.Context, c *qmp.Conn, vm *spec.VM, app *applied) (string, error) {
	spare := app.HotplugPorts
	if len(spare) == 0 {
		spare = qemuargs.SpareRootPorts(vm)
	}
	if vm.Machine == "pc" {
		return qemuargs.PCIRootBus, nil
	}
	if len(spare) == 0 {
		return "", errors.New("no hotplug root ports (hotplug_slots = 0)")
	}
	var buses []pciBus
	if err := c.Execute(ctx, "query-pci", nil, &buses); err != nil {
		return "", fmt.Errorf("query-pci: %w", err)
	}
	used := map[string]bool{}
	for _, b := range buses {
		for _, d := range b.Devices {
			if d.PCIBridge != nil && len(d.PCIBridge.Devices) > 0 {
				used[d.QdevID] = true
			}
		}
	}
	for _, id := range spare {
		if !used[id] {
			return id, nil
		}
	}
	return "", fmt.Errorf("all %d hotplug root ports are in use", len(spare))
}
