package hotplug

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// The NIC hot-plug operations in the journal.
const (
	opNICAttach operation.Kind = "nic-attach"
	opNICDetach operation.Kind = "nic-detach"
)

// A NIC attach's own steps (Step names them: `nic "n1": tap`).
const (
	stepTap       operation.Step = "tap"
	stepNetdevAdd operation.Step = "netdev_add"
)

func nicKind() kind {
	return kind{attach: opNICAttach, detach: opNICDetach, load: func(e *Engine, vm string, o *operation.Op) (Device, error) {
		in, err := operation.IntentOf[nicIntent](o)
		return &nic{e: e, vm: vm, in: in}, err
	}}
}

// nicIntent is a NIC hot-plug's.
type nicIntent struct {
	NIC      spec.NIC `json:"nic"`
	FromFile bool     `json:"from_file,omitempty"` // a NIC of the VM's file (apply)
	Bus      string   `json:"bus,omitempty"`
	Netdev   string   `json:"netdev"`
	Device   string   `json:"device"`
}

// AttachNIC hot-plugs n into the running VM: the host side exactly as at
// boot (nics.NICUp), then netdev_add and device_add with the values
// qemuargs renders for the command line, into a free spare root port.
// Defaults are filled as for a NIC in the file, but the MAC
// (spec.AllocMAC): from the VM's and the NIC's names, never one of the
// VM's other NICs. The NIC is recorded in state.json (AttachedNICs) and
// net.json, so detach, down and the stop hook remove it. On failure every
// step is undone. fromFile: a NIC of the VM's file (apply), recorded in
// the record's spec rather than as attached by hand. It returns n with its
// defaults filled.
func (e *Engine) AttachNIC(ctx context.Context, vm string, n spec.NIC, fromFile bool) (spec.NIC, error) {
	r := &nicAttach{e: e, vm: vm, n: n, fromFile: fromFile}
	err := e.attach(ctx, vm, r)
	return r.n, err
}

// nicAttach is a NIC's attach as its kind checks it.
type nicAttach struct {
	e        *Engine
	vm       string
	n        spec.NIC
	fromFile bool
	nd       qemuargs.Netdev
}

func (r *nicAttach) kind() kind { return nicKind() }

func (r *nicAttach) fail(err error) error { return opErr(r.vm, fmt.Sprintf("nic %q", r.n.Name), err) }

func (r *nicAttach) check(ctx context.Context, v *vmstore.View, down error) (bool, error) {
	if down != nil {
		return false, vmerr.Wrap(r.vm, down)
	}
	if err := r.e.env.CheckPath("cni_config", r.n.CNIConfig); err != nil { // before anything reads it
		return false, vmerr.Wrap(r.vm, fmt.Errorf("attach nic %q: cni_config: %w", r.n.Name, err))
	}
	var err error
	if r.n, err = r.newNIC(ctx, v, r.n); err != nil {
		return false, err
	}
	if r.nd, err = qemuargs.NICNetdev(r.n, r.e.env.Net().Vhost()); err != nil {
		return false, vmerr.Wrap(r.vm, err)
	}
	return false, nil
}

func (r *nicAttach) plug(_ context.Context, _ *vmstore.View, c *qmp.Conn, bus string) (Plug, error) {
	dev := qemuargs.NICDevice(r.n, bus)
	st, err := nics.ReadRecord(r.e.state().Paths(r.vm))
	if errors.Is(err, os.ErrNotExist) {
		st, err = r.e.env.Net().NewRecord(r.vm), nil
	}
	if err != nil {
		return nil, err
	}
	in := nicIntent{NIC: r.n, FromFile: r.fromFile, Bus: bus, Netdev: r.nd.ID, Device: dev.ID}
	return &nic{e: r.e, vm: r.vm, in: in, c: c, nd: r.nd, dev: dev, st: st}, nil
}

// newNIC fills n's defaults (its MAC from spec.AllocMAC) and checks it
// against the VM's other NICs, its sandbox and the host, touching nothing.
func (r *nicAttach) newNIC(ctx context.Context, v *vmstore.View, n spec.NIC) (spec.NIC, error) {
	name, app, vm := r.vm, v.Applied, v.Booted
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
		return vmerr.Wrap(name, fmt.Errorf("nic %q: %s: %w", n.Name, field, err))
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
		return n, vmerr.Wrap(name, err)
	}
	if why := r.e.TapRefusal(name); why != "" && n.UsesTap() {
		return n, fail("type", errors.New(why+": give it a NIC in its file and restart it"))
	}
	if err := r.e.env.Net().CheckNIC(ctx, n, r.e.env.Net().Vhost()); err != nil {
		var fe *nics.FieldError
		if errors.As(err, &fe) {
			return n, fail(fe.Field, fe.Err)
		}
		return n, fail("type", err)
	}
	return n, nil
}

// TapRefusal says why the running VM cannot take a NIC on a host tap
// (bridge, ovs, cni, network), "" when it can: its sandbox was made at
// start without the host's network. The attach and apply's plan both ask
// it, so plan never calls live what the attach refuses.
func (e *Engine) TapRefusal(vm string) string {
	if c, err := e.env.Confiner().Read(vm); err == nil && !slices.Contains(c.Uses, "/dev/net/tun") {
		return "the VM was started without a tap NIC, so its QEMU cannot reach the host's taps (no /dev/net/tun, no host network in its sandbox)"
	}
	return ""
}

// DetachNIC unplugs a hot-plugged NIC: device_del, wait for the guest to
// release it (DEVICE_DELETED), netdev_del, then the host side goes. NICs
// the VM booted with stay: they are part of its file. fromFile: a NIC of
// the VM's file that the file no longer has (apply).
func (e *Engine) DetachNIC(ctx context.Context, vm, name string, fromFile bool) error {
	return e.detach(ctx, vm, &nicDetach{e: e, vm: vm, name: name, fromFile: fromFile})
}

// nicDetach is a NIC's detach as its kind checks it.
type nicDetach struct {
	e        *Engine
	vm, name string
	fromFile bool
}

func (r *nicDetach) kind() kind { return nicKind() }

// fail: the detach's errors name the NIC where they arise (vmnet's too).
func (r *nicDetach) fail(err error) error { return vmerr.Wrap(r.vm, err) }

func (r *nicDetach) find(_ context.Context, v *vmstore.View, down error) (Device, error) {
	if down != nil {
		return nil, down
	}
	app, vm, name := v.Applied, v.Booted, r.name
	var target spec.NIC
	i := slices.IndexFunc(app.AttachedNICs, func(n spec.NIC) bool { return n.Name == name })
	if r.fromFile {
		i = slices.IndexFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("nic %q: the VM does not run with it", name)
		}
		target = vm.NICs[i]
	} else if i >= 0 {
		target = app.AttachedNICs[i]
	}
	if i < 0 {
		if slices.ContainsFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == name }) {
			return nil, fmt.Errorf("nic %q is in the VM's file, not hot-plugged: remove it there and restart", name)
		}
		return nil, fmt.Errorf("no hot-plugged nic %q", name)
	}
	in := nicIntent{NIC: target, FromFile: r.fromFile, Netdev: qemuargs.NetdevID(name), Device: qemuargs.NICDeviceID(name)}
	return &nic{e: r.e, vm: r.vm, in: in}, nil
}

// nic is one NIC as the engine plugs, unplugs and recovers it.
type nic struct {
	e   *Engine
	vm  string
	in  nicIntent
	c   *qmp.Conn // an attach's QEMU, backend, device and network record
	nd  qemuargs.Netdev
	dev qemuargs.Device
	st  *nics.Record
}

var _ Plug = (*nic)(nil)

func (n *nic) Label() string                        { return fmt.Sprintf("nic %q", n.in.NIC.Name) }
func (n *nic) Step(s operation.Step) operation.Step { return operation.Step(n.Label()+": ") + s }
func (n *nic) Intent() any                          { return n.in }
func (n *nic) ID() string                           { return n.in.Device }
func (n *nic) Recorded(app *vmstore.Applied) bool   { return hasNIC(app, n.in.NIC.Name) }
func (n *nic) Forget(app *vmstore.Applied) error    { return dropNIC(app, n.in.NIC.Name) }

func (n *nic) Record(app *vmstore.Applied, _ *qdev.Present) error {
	return recordNIC(app, n.in.NIC, n.in.FromFile)
}

// HostSteps: the tap, as at boot (none for a NIC without one).
func (n *nic) HostSteps(*operation.Op) []steps.Step {
	return []steps.Step{{Name: string(n.Step(stepTap)), Do: func(ctx context.Context) error {
		if !n.in.NIC.UsesTap() {
			return nil
		}
		owner, err := n.e.env.TapOwner(ctx, n.vm)
		if err != nil {
			return err
		}
		return n.e.env.Net().NICUp(ctx, n.vm, n.in.NIC, n.in.Bus, owner, n.st)
	}, Undo: func(ctx context.Context) { n.e.env.Net().Forget(ctx, n.vm, n.in.NIC.Name) }}}
}

// Parts: netdev_add, then device_add.
func (n *nic) Parts() ([]steps.Step, error) {
	c := n.c
	return []steps.Step{
		{Name: string(n.Step(stepNetdevAdd)), Do: func(ctx context.Context) error {
			return c.NetdevAdd(ctx, n.nd)
		}, Undo: func(ctx context.Context) { _ = c.NetdevDel(ctx, n.nd.ID) }},
		{Name: string(n.Step(stepDeviceAdd)), Do: func(ctx context.Context) error {
			return c.DeviceAdd(ctx, n.dev)
		}, Undo: func(ctx context.Context) {
			// The record failed (a full filesystem): the guest gives it back.
			if err := qdev.Unplug(ctx, c, "nic", n.dev.ID, n.e.unplugTimeout()); err != nil {
				n.e.logger().Warn("undo device_add", "vm", n.vm, "nic", n.in.NIC.Name, "err", err)
			}
		}},
	}, nil
}

// Unplug: device_del and the wait for the guest, then netdev_del.
func (n *nic) Unplug(ctx context.Context, c *qmp.Conn) error {
	if err := qdev.Unplug(ctx, c, "NIC", n.in.Device, n.e.unplugTimeout()); err != nil {
		return fmt.Errorf("%s: %w", n.Label(), err)
	}
	if err := n.RemoveParts(ctx, c, qdev.Present{}); err != nil {
		return fmt.Errorf("%s: %w", n.Label(), err)
	}
	return nil
}

// RemoveParts: the NIC's backend, which QEMU may or may not have.
func (n *nic) RemoveParts(ctx context.Context, c *qmp.Conn, _ qdev.Present) error {
	if err := c.NetdevDel(ctx, n.in.Netdev); err != nil && !qmp.IsClass(err, qmp.ClassDeviceNotFound) {
		return fmt.Errorf("netdev_del %s: %w", n.in.Netdev, err)
	}
	return nil
}

// Release removes the NIC's host side (its tap, port or CNI attachment)
// and its entry in the network record.
func (n *nic) Release(ctx context.Context) error {
	return n.e.env.Net().Forget(ctx, n.vm, n.in.NIC.Name)
}

// Undo: the attach made only the host side Release removes.
func (n *nic) Undo(ctx context.Context) (string, error) {
	if err := n.Release(ctx); err != nil {
		return "", err
	}
	return "its backend and tap are removed", nil
}
