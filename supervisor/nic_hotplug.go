package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/internal/devices"
	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/internal/vmnet"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// The NIC hot-plug operations in the journal.
const (
	opNICAttach operation.Kind = "nic-attach"
	opNICDetach operation.Kind = "nic-detach"
)

// AttachNIC hot-plugs n into the running VM: the host side exactly as at
// boot (nicUp), then netdev_add and device_add with the values qemuargs
// renders for the command line, into a free spare root port. Defaults are
// filled as for a NIC in the file, but the MAC (spec.AllocMAC): from the
// VM's and the NIC's names, never one of the VM's other NICs. The NIC is recorded in state.json (AttachedNICs) and
// net.json, so detach, down and the stop hook remove it. On failure every
// step is undone.
func (s *Supervisor) AttachNIC(ctx context.Context, name string, n spec.NIC) (spec.NIC, error) {
	return s.attachNIC(ctx, name, n, false)
}

// attachNIC is AttachNIC; fromFile: a NIC of the VM's file (apply),
// recorded in the record's spec rather than as attached by hand.
func (s *Supervisor) attachNIC(ctx context.Context, name string, n spec.NIC, fromFile bool) (spec.NIC, error) {
	lk, err := s.lock(ctx, name, "nic-attach")
	if err != nil {
		return n, err
	}
	defer lk.Unlock()
	v, err := s.view(name)
	if err != nil {
		return n, vmErr(name, err)
	}
	app, vm := v.Applied, v.Booted
	if err := s.CheckPath("cni_config", n.CNIConfig); err != nil { // before anything reads it
		return n, vmErr(name, fmt.Errorf("attach nic %q: cni_config: %w", n.Name, err))
	}
	n, err = s.newNIC(ctx, name, app, vm, n)
	if err != nil {
		return n, err
	}
	vhost := s.vhostNet()
	nd, err := qemuargs.NICNetdev(n, vhost)
	if err != nil {
		return n, vmErr(name, err)
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return n, err
	}
	defer release()
	bus, err := devices.FreeRootPort(ctx, c, vm, app.HotplugPorts)
	if err != nil {
		return n, vmErr(name, fmt.Errorf("nic %q: %w", n.Name, err))
	}
	dev := qemuargs.NICDevice(n, bus)
	p := s.paths(name)
	st, err := vmnet.ReadRecord(p)
	if errors.Is(err, os.ErrNotExist) {
		st, err = s.net().NewRecord(name), nil
	}
	if err != nil {
		return n, err
	}
	op, err := s.beginOp(ctx, name, opNICAttach, nicIntent{NIC: n, FromFile: fromFile, Bus: bus, Netdev: nd.ID, Device: dev.ID})
	if err != nil {
		return n, vmErr(name, err)
	}
	defer op.End() // done or undone here; a kill leaves it to recover
	steps := []step{
		{Name: fmt.Sprintf("nic %q: tap", n.Name), Do: func(ctx context.Context) error {
			if !n.UsesTap() {
				return nil
			}
			owner, err := s.tapOwner(ctx, name)
			if err != nil {
				return err
			}
			return s.net().NICUp(ctx, name, n, bus, owner, st)
		}, Undo: func(ctx context.Context) { s.net().Forget(ctx, name, n.Name) }},
		{Name: fmt.Sprintf("nic %q: netdev_add", n.Name), Do: func(ctx context.Context) error {
			return c.NetdevAdd(ctx, nd)
		}, Undo: func(ctx context.Context) { _ = c.NetdevDel(ctx, nd.ID) }},
		{Name: fmt.Sprintf("nic %q: device_add", n.Name), Do: func(ctx context.Context) error {
			return c.DeviceAdd(ctx, dev)
		}, Undo: func(ctx context.Context) {
			// The record failed (a full filesystem): the guest gives it back.
			if err := devices.Unplug(ctx, c, "nic", dev.ID, s.opts.UnplugTimeout); err != nil {
				s.opts.Logger.Warn("undo device_add", "vm", name, "nic", n.Name, "err", err)
			}
		}},
		{Name: fmt.Sprintf("nic %q: record", n.Name), Do: func(ctx context.Context) error {
			if err := recordNIC(app, n, fromFile); err != nil {
				return err
			}
			return s.state.RewriteApplied(app)
		}},
	}
	if _, err := runSteps(ctx, name, steps, op.After()); err != nil {
		return n, err
	}
	return n, nil
}

// DetachNIC unplugs a hot-plugged NIC: device_del, wait for the guest to
// release it (DEVICE_DELETED), netdev_del, then the host side goes. NICs the
// VM booted with stay: they are part of its file.
func (s *Supervisor) DetachNIC(ctx context.Context, name, nic string) error {
	return s.detachNIC(ctx, name, nic, false)
}

// detachNIC is DetachNIC; fromFile: a NIC of the VM's file that the file
// no longer has (apply).
func (s *Supervisor) detachNIC(ctx context.Context, name, nic string, fromFile bool) error {
	lk, err := s.lock(ctx, name, "nic-detach")
	if err != nil {
		return err
	}
	defer lk.Unlock()
	v, err := s.view(name)
	if err != nil {
		return err
	}
	app, vm := v.Applied, v.Booted
	var target spec.NIC
	i := slices.IndexFunc(app.AttachedNICs, func(n spec.NIC) bool { return n.Name == nic })
	if fromFile {
		i = slices.IndexFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == nic })
		if i < 0 {
			return vmErr(name, fmt.Errorf("nic %q: the VM does not run with it", nic))
		}
		target = vm.NICs[i]
	} else if i >= 0 {
		target = app.AttachedNICs[i]
	}
	if i < 0 {
		if slices.ContainsFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == nic }) {
			return vmErr(name, fmt.Errorf("nic %q is in the VM's file, not hot-plugged: remove it there and restart", nic))
		}
		return vmErr(name, fmt.Errorf("no hot-plugged nic %q", nic))
	}
	op, err := s.beginOp(ctx, name, opNICDetach, nicIntent{NIC: target, FromFile: fromFile, Netdev: qemuargs.NetdevID(nic), Device: qemuargs.NICDeviceID(nic)})
	if err != nil {
		return vmErr(name, err)
	}
	defer op.End()
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if err := devices.Unplug(ctx, c, "NIC", qemuargs.NICDeviceID(nic), s.opts.UnplugTimeout); err != nil {
		return vmErr(name, fmt.Errorf("nic %q: %w", nic, err))
	}
	op.Step(stepUnplugged("nic", nic))
	if err := c.NetdevDel(ctx, qemuargs.NetdevID(nic)); err != nil && !qmp.IsClass(err, qmp.ClassDeviceNotFound) {
		return vmErr(name, fmt.Errorf("nic %q: netdev_del: %w", nic, err))
	}
	if err := s.net().Forget(ctx, name, nic); err != nil {
		return vmErr(name, err)
	}
	if err := dropNIC(app, nic); err != nil {
		return err
	}
	return s.state.RewriteApplied(app)
}

// newNIC fills n's defaults (its MAC from spec.AllocMAC) and checks it
// against the VM's other NICs, its sandbox and the host, touching nothing.
func (s *Supervisor) newNIC(ctx context.Context, name string, app *vmstate.Applied, vm *spec.VM, n spec.NIC) (spec.NIC, error) {
	all := append(slices.Clone(vm.NICs), app.AttachedNICs...)
	if n.MAC == "" {
		// Not by index (a detach frees an index another NIC's MAC came
		// from): by name, never a MAC a NIC of the VM has.
		n.MAC = spec.AllocMAC(name, n.Name, func(mac string) bool {
			return slices.ContainsFunc(all, func(o spec.NIC) bool { return strings.EqualFold(o.MAC, mac) })
		})
	}
	n.ApplyDefaults(vm, len(all))
	fail := func(field string, err error) error {
		return vmErr(name, fmt.Errorf("nic %q: %s: %w", n.Name, field, err))
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
		return n, vmErr(name, err)
	}
	if c, err := s.confiner().Read(name); err == nil && n.UsesTap() && !slices.Contains(c.Uses, "/dev/net/tun") {
		// Its sandbox was made at start without the host's network.
		return n, fail("type", errors.New("the VM was started without a tap NIC, so its QEMU cannot reach the host's taps (no /dev/net/tun, no host network in its sandbox): give it a NIC in its file and restart it"))
	}
	if err := s.net().CheckNIC(ctx, n, s.vhostNet()); err != nil {
		var fe *vmnet.FieldError
		if errors.As(err, &fe) {
			return n, fail(fe.Field, fe.Err)
		}
		return n, fail("type", err)
	}
	return n, nil
}
