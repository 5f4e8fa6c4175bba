package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vmsup/vmsup/internal/devices"
	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/internal/vmstate"
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

// stepHostDevDel is journaled once the guest released a host device.
const stepHostDevDel operation.Step = "device_del"

// hostDevIntent is a host device hotplug's journal entry.
type hostDevIntent struct {
	Dev    spec.HostDev `json:"dev"`
	Bus    string       `json:"bus,omitempty"`
	Device string       `json:"device"`
	Nodes  []string     `json:"nodes"` // the nodes this device adds to QEMU's /dev (not shared with the VM's others)
	Grants []string     `json:"grants"`
}

// AttachHostDev passes the host PCI device h through to the running VM.
func (s *Supervisor) AttachHostDev(ctx context.Context, name string, h spec.HostDev) error {
	fail := func(err error) error { return vmErr(name, fmt.Errorf("attach hostdev %s: %w", h.Address, err)) }
	addr, err := spec.ParsePCIAddress(h.Address)
	if err != nil {
		return fail(err)
	}
	h.Address = addr
	if h.Name == "" {
		h.Name = spec.HostDevName(addr)
	}
	lk, err := s.lock(ctx, name, string(opHostDevAttach))
	if err != nil {
		return err
	}
	defer lk.Unlock()
	view, err := s.view(name)
	if errors.Is(err, ErrNotRunning) {
		return fail(errors.New("the VM is not running (a hot-plug is live only: put the device in the file's [[hostdev]] to boot with it)"))
	}
	if err != nil {
		return fail(err)
	}
	app, vm := view.Applied, view.Booted
	others := hostDevAddrs(vm, app)
	for _, d := range append(slices.Clone(vm.HostDevs), attachedDevs(app)...) {
		if d.Address == addr || d.Name == h.Name {
			return fail(fmt.Errorf("the VM already has host device %s (%s)", d.Address, d.Name))
		}
	}
	v := s.vfio()
	if err := v.Check(addr, append(others, addr)); err != nil {
		return fail(err)
	}
	nodes, err := s.newHostDevNodes(addr, others)
	if err != nil {
		return fail(err)
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	bus, err := devices.FreeRootPort(ctx, c, vm, app.HotplugPorts)
	if err != nil {
		return fail(err)
	}
	dev, err := qemuargs.HostDevDevice(h, bus)
	if err != nil {
		return fail(err)
	}
	pid := qemuPID(name, s.paths(name).QMP)
	if pid == 0 {
		return fail(errors.New("its QEMU is not in this PID namespace"))
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return fail(err)
	}
	all, _ := v.Nodes([]string{addr})
	in := hostDevIntent{Dev: h, Bus: bus, Device: dev.ID, Nodes: nodes, Grants: all}
	op, err := s.beginOp(ctx, name, opHostDevAttach, in)
	if err != nil {
		return fail(err)
	}
	defer op.End() // done or undone here; a kill leaves it to recover
	a := hostDevAttach{s: s, name: name, h: h, in: in, all: all, pid: pid, sd: sd, c: c, dev: dev, app: app}
	list := a.steps()
	if _, err := runSteps(ctx, name, list, op.After()); err != nil {
		return fail(stepCause(err))
	}
	return nil
}

// hostDevAttach is one attach's parts, for its steps.
type hostDevAttach struct {
	s    *Supervisor
	name string
	h    spec.HostDev
	in   hostDevIntent
	all  []string // every node the device needs (container and group)
	pid  int      // QEMU, in this PID namespace
	sd   *units.Manager
	c    *qmp.Conn
	dev  qemuargs.Device
	app  *vmstate.Applied
}

// steps: bind, confine, nodes, device_add, record; each undone if a later
// one fails.
func (a *hostDevAttach) steps() []step {
	s, v, addr := a.s, a.s.vfio(), a.h.Address
	record := s.paths(a.name).HostDevs()
	var rules []units.PathRule
	for _, n := range a.all {
		rules = append(rules, units.PathRule{Path: n, Mode: "rw"})
	}
	return []step{
		{Name: "bind", Do: func(context.Context) error { return v.TakeOne(record, addr) },
			Undo: func(context.Context) { _ = v.GiveBackOne(record, addr) }},
		{Name: "confine", Do: func(ctx context.Context) error { return s.ConfinePaths(ctx, a.name, rules...) },
			Undo: func(ctx context.Context) { _ = s.ReleasePaths(ctx, a.name, a.in.Grants...) }},
		{Name: "nodes", Do: func(ctx context.Context) error {
			for _, n := range a.all {
				if err := a.sd.AddDevice(ctx, s.state.UnitOf(a.name), a.pid, n, s.qemuUID(a.name)); err != nil {
					return err
				}
			}
			return nil
		}, Undo: func(ctx context.Context) { removeNodes(ctx, a.pid, a.in.Nodes) }},
		{Name: "device_add", Do: func(ctx context.Context) error {
			if err := a.c.DeviceAdd(ctx, a.dev); err != nil {
				return fmt.Errorf("device_add: %w", err)
			}
			return nil
		}, Undo: func(ctx context.Context) { _ = devices.Unplug(ctx, a.c, "host device", a.dev.ID, s.opts.UnplugTimeout) }},
		{Name: "record", Do: func(context.Context) error {
			a.app.AttachedHostDevs = append(a.app.AttachedHostDevs, vmstate.AttachedHostDev{Dev: a.h, Bus: a.in.Bus})
			return s.state.RewriteApplied(a.app)
		}},
	}
}

// DetachHostDev unplugs a host device hot-plugged with AttachHostDev (by
// address or name) and gives it back to its host driver.
func (s *Supervisor) DetachHostDev(ctx context.Context, name, which string) error {
	fail := func(err error) error { return vmErr(name, fmt.Errorf("detach hostdev %s: %w", which, err)) }
	lk, err := s.lock(ctx, name, string(opHostDevDetach))
	if err != nil {
		return err
	}
	defer lk.Unlock()
	view, err := s.view(name)
	if err != nil {
		return fail(err)
	}
	app, vm := view.Applied, view.Booted
	i := slices.IndexFunc(app.AttachedHostDevs, func(a vmstate.AttachedHostDev) bool {
		return a.Dev.Address == which || a.Dev.Name == which
	})
	if i < 0 {
		if slices.ContainsFunc(vm.HostDevs, func(d spec.HostDev) bool { return d.Address == which || d.Name == which }) {
			return fail(errors.New("it is in the VM's file: remove it there and restart the VM"))
		}
		return fail(errors.New("no such hot-plugged host device"))
	}
	a := app.AttachedHostDevs[i]
	others := slices.DeleteFunc(hostDevAddrs(vm, app), func(x string) bool { return x == a.Dev.Address })
	nodes, err := s.newHostDevNodes(a.Dev.Address, others)
	if err != nil {
		return fail(err)
	}
	all, _ := s.vfio().Nodes([]string{a.Dev.Address})
	in := hostDevIntent{Dev: a.Dev, Bus: a.Bus, Device: qemuargs.HostDevDeviceID(a.Dev.Name), Nodes: nodes, Grants: all}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer release()
	op, err := s.beginOp(ctx, name, opHostDevDetach, in)
	if err != nil {
		return fail(err)
	}
	defer op.End()
	if err := devices.Unplug(ctx, c, "host device", in.Device, s.opts.UnplugTimeout); err != nil {
		return fail(err)
	}
	op.Step(stepHostDevDel)
	if err := s.finishHostDevDetach(ctx, name, in); err != nil {
		return fail(err)
	}
	return nil
}

// finishHostDevDetach is what follows device_del: the nodes out of QEMU's
// /dev, the grants taken back, the device given back, the record.
func (s *Supervisor) finishHostDevDetach(ctx context.Context, name string, in hostDevIntent) error {
	removeNodes(ctx, qemuPID(name, s.paths(name).QMP), in.Nodes)
	if err := s.ReleasePaths(ctx, name, in.Grants...); err != nil {
		return err
	}
	if err := s.vfio().GiveBackOne(s.paths(name).HostDevs(), in.Dev.Address); err != nil {
		return err
	}
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return err
	}
	app.AttachedHostDevs = slices.DeleteFunc(app.AttachedHostDevs, func(a vmstate.AttachedHostDev) bool {
		return a.Dev.Address == in.Dev.Address
	})
	return s.state.RewriteApplied(app)
}

// recoverHostDevAttach settles an attach whose command died: a device QEMU
// has is recorded; else everything it made is undone.
func (s *Supervisor) recoverHostDevAttach(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := intentOf[hostDevIntent](op)
	if err != nil {
		return "", err
	}
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return "", err
	}
	if slices.ContainsFunc(app.AttachedHostDevs, func(a vmstate.AttachedHostDev) bool { return a.Dev.Address == in.Dev.Address }) {
		return fmt.Sprintf("host device %s was attached and recorded", in.Dev.Address), nil
	}
	c, release, err := s.liveQMP(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	if c != nil {
		pr, err := devices.Query(ctx, c)
		if err != nil {
			return "", err
		}
		if pr.Devices[in.Device] {
			app.AttachedHostDevs = append(app.AttachedHostDevs, vmstate.AttachedHostDev{Dev: in.Dev, Bus: in.Bus})
			if err := s.state.RewriteApplied(app); err != nil {
				return "", fmt.Errorf("record: %w", err)
			}
			return fmt.Sprintf("host device %s was plugged: adopted and recorded", in.Dev.Address), nil
		}
	}
	if err := s.finishHostDevDetach(ctx, name, in); err != nil {
		return "", err
	}
	return fmt.Sprintf("host device %s had not reached the guest: given back to its driver", in.Dev.Address), nil
}

// recoverHostDevDetach settles a detach whose command died: a device QEMU
// still has stays attached; one it let go is given back.
func (s *Supervisor) recoverHostDevDetach(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := intentOf[hostDevIntent](op)
	if err != nil {
		return "", err
	}
	c, release, err := s.liveQMP(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	if c != nil {
		pr, err := devices.Query(ctx, c)
		if err != nil {
			return "", err
		}
		if pr.Devices[in.Device] {
			return fmt.Sprintf("host device %s is still the guest's: it stays attached", in.Dev.Address), nil
		}
	}
	if err := s.finishHostDevDetach(ctx, name, in); err != nil {
		return "", err
	}
	return fmt.Sprintf("host device %s was unplugged: given back to its driver", in.Dev.Address), nil
}

// hostDevAddrs are the addresses of the VM's host devices, boot-time and
// hot-plugged.
func hostDevAddrs(vm *spec.VM, app *vmstate.Applied) []string {
	var out []string
	for _, d := range append(slices.Clone(vm.HostDevs), attachedDevs(app)...) {
		out = append(out, d.Address)
	}
	return out
}

func attachedDevs(app *vmstate.Applied) []spec.HostDev {
	var out []spec.HostDev
	for _, a := range app.AttachedHostDevs {
		out = append(out, a.Dev)
	}
	return out
}

// newHostDevNodes are the /dev/vfio nodes of addr that none of the VM's
// other host devices (others) use: what its attach adds to QEMU's /dev and
// its detach removes. The container (/dev/vfio/vfio) is never removed.
func (s *Supervisor) newHostDevNodes(addr string, others []string) ([]string, error) {
	mine, err := s.vfio().Nodes([]string{addr})
	if err != nil {
		return nil, err
	}
	theirs, err := s.vfio().Nodes(others)
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

// qemuUID is the user the VM's QEMU runs as (0 without confinement).
func (s *Supervisor) qemuUID(name string) int {
	if c, err := s.confiner().Read(name); err == nil {
		return int(c.UID)
	}
	return 0
}
