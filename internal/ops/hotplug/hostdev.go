package hotplug

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vmsup/vmsup/internal/host/vfio"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Hot-plugging host PCI devices into a running VM (vmsup hostdev attach):
// live only, as `virsh attach-device --live`: the device is given back
// when QEMU ends; a device the VM should boot with goes in its file's
// [[hostdev]]. The steps, each undone if a later one fails, journaled for
// the next command if vmsup dies: bind to vfio-pci (the driver it had
// added to the VM's record first), the group's nodes to QEMU's confinement
// and into its running unit (units.AddDevice), device_add, the record.

// Journal kinds of host device hotplug.
const (
	opHostDevAttach operation.Kind = "hostdev-attach"
	opHostDevDetach operation.Kind = "hostdev-detach"
)

// A host device attach's own host steps.
const (
	stepBind  operation.Step = "bind"
	stepNodes operation.Step = "nodes"
)

func hostDevKind() kind {
	return kind{attach: opHostDevAttach, detach: opHostDevDetach, load: func(e *Engine, vm string, o *operation.Op) (Device, error) {
		in, err := operation.IntentOf[hostDevIntent](o)
		return &hostDev{e: e, vm: vm, in: in}, err
	}}
}

// hostDevIntent is a host device hotplug's journal entry.
type hostDevIntent struct {
	Dev    spec.HostDev `json:"dev"`
	Bus    string       `json:"bus,omitempty"`
	Device string       `json:"device"`
	Nodes  []string     `json:"nodes"` // the nodes this device adds to QEMU's /dev (not shared with the VM's others)
	Grants []string     `json:"grants"`
}

// AttachHostDev passes the host PCI device h through to the running VM.
func (e *Engine) AttachHostDev(ctx context.Context, vm string, h spec.HostDev) error {
	r := &hostDevAttach{e: e, vm: vm, h: h}
	addr, err := spec.ParsePCIAddress(h.Address)
	if err != nil {
		return r.fail(err)
	}
	r.h.Address = addr
	if r.h.Name == "" {
		r.h.Name = spec.HostDevName(addr)
	}
	return e.attach(ctx, vm, r)
}

// hostDevAttach is a host device's attach as its kind checks it.
type hostDevAttach struct {
	e     *Engine
	vm    string
	h     spec.HostDev
	nodes []string // what it adds to QEMU's /dev
}

func (r *hostDevAttach) kind() kind { return hostDevKind() }

func (r *hostDevAttach) fail(err error) error {
	return opErr(r.vm, "attach hostdev "+r.h.Address, steps.Cause(err))
}

func (r *hostDevAttach) check(_ context.Context, v *vmstore.View, down error) (bool, error) {
	if down != nil {
		return false, errors.New("the VM is not running (a hot-plug is live only: put the device in the file's [[hostdev]] to boot with it)")
	}
	app, vm, addr := v.Applied, v.Booted, r.h.Address
	others := hostDevAddrs(vm, app)
	for _, d := range append(slices.Clone(vm.HostDevs), attachedDevs(app)...) {
		if d.Address == addr || d.Name == r.h.Name {
			return false, fmt.Errorf("the VM already has host device %s (%s)", d.Address, d.Name)
		}
	}
	vf := r.e.env.VFIO()
	if err := vf.Check(addr, append(others, addr)); err != nil {
		return false, err
	}
	var err error
	r.nodes, err = newHostDevNodes(vf, addr, others)
	return false, err
}

func (r *hostDevAttach) plug(ctx context.Context, _ *vmstore.View, c *qmp.Conn, bus string) (Plug, error) {
	dev, err := qemuargs.HostDevDevice(r.h, bus)
	if err != nil {
		return nil, err
	}
	pid := r.e.qemuPID(r.vm)
	if pid == 0 {
		return nil, errors.New("its QEMU is not in this PID namespace")
	}
	sd, err := r.e.env.Systemd(ctx)
	if err != nil {
		return nil, err
	}
	all, _ := r.e.env.VFIO().Nodes([]string{r.h.Address})
	in := hostDevIntent{Dev: r.h, Bus: bus, Device: dev.ID, Nodes: r.nodes, Grants: all}
	return &hostDev{e: r.e, vm: r.vm, in: in, pid: pid, sd: sd, c: c, dev: dev}, nil
}

// DetachHostDev unplugs a host device hot-plugged with AttachHostDev (by
// address or name) and gives it back to its host driver.
func (e *Engine) DetachHostDev(ctx context.Context, vm, which string) error {
	return e.detach(ctx, vm, &hostDevDetach{e: e, vm: vm, which: which})
}

// hostDevDetach is a host device's detach as its kind checks it.
type hostDevDetach struct {
	e         *Engine
	vm, which string
}

func (r *hostDevDetach) kind() kind { return hostDevKind() }

func (r *hostDevDetach) fail(err error) error { return opErr(r.vm, "detach hostdev "+r.which, err) }

func (r *hostDevDetach) find(_ context.Context, v *vmstore.View, down error) (Device, error) {
	if down != nil {
		return nil, down
	}
	app, vm, which := v.Applied, v.Booted, r.which
	i := slices.IndexFunc(app.AttachedHostDevs, func(a vmstore.AttachedHostDev) bool {
		return a.Dev.Address == which || a.Dev.Name == which
	})
	if i < 0 {
		if slices.ContainsFunc(vm.HostDevs, func(d spec.HostDev) bool { return d.Address == which || d.Name == which }) {
			return nil, errors.New("it is in the VM's file: remove it there and restart the VM")
		}
		return nil, errors.New("no such hot-plugged host device")
	}
	a := app.AttachedHostDevs[i]
	others := slices.DeleteFunc(hostDevAddrs(vm, app), func(x string) bool { return x == a.Dev.Address })
	vf := r.e.env.VFIO()
	nodes, err := newHostDevNodes(vf, a.Dev.Address, others)
	if err != nil {
		return nil, err
	}
	all, _ := vf.Nodes([]string{a.Dev.Address})
	in := hostDevIntent{Dev: a.Dev, Bus: a.Bus, Device: qemuargs.HostDevDeviceID(a.Dev.Name), Nodes: nodes, Grants: all}
	return &hostDev{e: r.e, vm: r.vm, in: in}, nil
}

// hostDev is one host device as the engine plugs, unplugs and recovers it.
type hostDev struct {
	e   *Engine
	vm  string
	in  hostDevIntent
	pid int            // an attach's QEMU, in this PID namespace
	sd  *units.Manager // the systemd running its unit
	c   *qmp.Conn
	dev qemuargs.Device
}

var _ Plug = (*hostDev)(nil)

func (h *hostDev) Label() string { return "host device " + h.in.Dev.Address }

func (h *hostDev) Intent() any                      { return h.in }
func (h *hostDev) ID() string                       { return h.in.Device }
func (h *hostDev) Recorded(a *vmstore.Applied) bool { return hasHostDev(a, h.in.Dev.Address) }

// Step: a host device's steps are named alone ("bind", "nodes"), as they
// were before the engine.
func (h *hostDev) Step(s operation.Step) operation.Step { return s }

func (h *hostDev) Record(app *vmstore.Applied, _ *qdev.Present) error {
	app.AttachedHostDevs = append(app.AttachedHostDevs, vmstore.AttachedHostDev{Dev: h.in.Dev, Bus: h.in.Bus})
	return nil
}

func (h *hostDev) Forget(app *vmstore.Applied) error {
	dropHostDev(app, h.in.Dev.Address)
	return nil
}

func (h *hostDev) record() string { return h.e.state().Paths(h.vm).HostDevs() }

// HostSteps: bind to vfio-pci, confine, the nodes into QEMU's /dev; each
// undone if a later one fails.
func (h *hostDev) HostSteps(*operation.Op) []steps.Step {
	host, v, addr := h.e.env, h.e.env.VFIO(), h.in.Dev.Address
	var rules []units.PathRule
	for _, n := range h.in.Grants {
		rules = append(rules, units.PathRule{Path: n, Mode: "rw"})
	}
	return []steps.Step{
		{Name: string(h.Step(stepBind)), Do: func(context.Context) error { return v.TakeOne(h.record(), addr) },
			Undo: func(context.Context) { _ = v.GiveBackOne(h.record(), addr) }},
		{Name: string(h.Step(stepConfine)), Do: func(ctx context.Context) error { return host.ConfinePaths(ctx, h.vm, rules...) },
			Undo: func(ctx context.Context) { _ = host.ReleasePaths(ctx, h.vm, h.in.Grants...) }},
		{Name: string(h.Step(stepNodes)), Do: func(ctx context.Context) error {
			uid := 0 // QEMU's user (root without confinement)
			if c, err := host.Confiner().Read(h.vm); err == nil {
				uid = int(c.UID)
			}
			for _, n := range h.in.Grants {
				if err := h.sd.AddDevice(ctx, host.State().UnitOf(h.vm), h.pid, n, uid); err != nil {
					return err
				}
			}
			return nil
		}, Undo: func(ctx context.Context) { removeNodes(ctx, h.pid, h.in.Nodes) }},
	}
}

// Parts: device_add.
func (h *hostDev) Parts() ([]steps.Step, error) {
	return []steps.Step{{Name: string(h.Step(stepDeviceAdd)), Do: func(ctx context.Context) error {
		if err := h.c.DeviceAdd(ctx, h.dev); err != nil {
			return fmt.Errorf("device_add: %w", err)
		}
		return nil
	}, Undo: func(ctx context.Context) {
		_ = qdev.Unplug(ctx, h.c, "host device", h.dev.ID, h.e.unplugTimeout())
	}}}, nil
}

func (h *hostDev) Unplug(ctx context.Context, c *qmp.Conn) error {
	return qdev.Unplug(ctx, c, "host device", h.in.Device, h.e.unplugTimeout())
}

// RemoveParts: a host device has no part but its device.
func (h *hostDev) RemoveParts(context.Context, *qmp.Conn, qdev.Present) error { return nil }

// Release is what follows device_del: the nodes out of QEMU's /dev, the
// grants taken back, the device given back to its driver.
func (h *hostDev) Release(ctx context.Context) error {
	removeNodes(ctx, h.e.qemuPID(h.vm), h.in.Nodes)
	if err := h.e.env.ReleasePaths(ctx, h.vm, h.in.Grants...); err != nil {
		return err
	}
	return h.e.env.VFIO().GiveBackOne(h.record(), h.in.Dev.Address)
}

// Undo: the attach made only the host side Release takes back.
func (h *hostDev) Undo(ctx context.Context) (string, error) {
	if err := h.Release(ctx); err != nil {
		return "", err
	}
	return "given back to its driver", nil
}

// hostDevAddrs are the addresses of the VM's host devices, boot-time and
// hot-plugged.
func hostDevAddrs(vm *spec.VM, app *vmstore.Applied) []string {
	var out []string
	for _, d := range append(slices.Clone(vm.HostDevs), attachedDevs(app)...) {
		out = append(out, d.Address)
	}
	return out
}

func attachedDevs(app *vmstore.Applied) []spec.HostDev {
	var out []spec.HostDev
	for _, a := range app.AttachedHostDevs {
		out = append(out, a.Dev)
	}
	return out
}

// newHostDevNodes are the /dev/vfio nodes of addr that none of the VM's
// other host devices (others) use: what its attach adds to QEMU's /dev and
// its detach removes. The container (/dev/vfio/vfio) is never removed.
func newHostDevNodes(v vfio.Host, addr string, others []string) ([]string, error) {
	mine, err := v.Nodes([]string{addr})
	if err != nil {
		return nil, err
	}
	theirs, err := v.Nodes(others)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range mine[1:] { // [0] is the container
		if !slices.Contains(theirs, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// removeNodes removes nodes from the mount namespace of QEMU (pid).
func removeNodes(ctx context.Context, pid int, nodes []string) {
	if pid == 0 {
		return
	}
	for _, n := range nodes {
		_ = units.RemoveDevice(ctx, pid, n)
	}
}
