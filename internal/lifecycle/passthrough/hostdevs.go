// Package hostdevs is the host side of a VM's host PCI devices
// ([[hostdev]]) around its start: the check that each is there and its
// IOMMU group free, the step that binds them to vfio-pci after recording
// the drivers they had, the unit's memory lock, and the teardown that gives
// them back however QEMU ended. The sysfs work is internal/host/vfio's (kept
// below qemuargs, whose tests use it); hot-plugging one is
// internal/ops/hotplug's.
package passthrough

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/vmsup/vmsup/internal/host/vfio"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Step is the start step that binds the VM's host devices to vfio-pci.
const Step = "hostdevs"

// Manager is the host devices' part of the starts on one host.
type Manager struct {
	VFIO   vfio.Host
	Logger *slog.Logger
}

var _ startplan.Contributor = Manager{}

// Check checks, touching nothing, that every host device of f is present
// and that its IOMMU group holds nothing the host still uses (the VM's
// other devices aside); an error names the field, one per device.
func (m Manager) Check(f *spec.File) error {
	var addrs []string
	for _, h := range f.VM.HostDevs {
		addrs = append(addrs, h.Address)
	}
	var errs []error
	for i, h := range f.VM.HostDevs {
		if f.Broken(fmt.Sprintf("hostdev[%d]", i)) {
			continue
		}
		if err := m.VFIO.Check(h.Address, addrs); err != nil {
			errs = append(errs, f.Errorf(fmt.Sprintf("hostdev[%d].address", i), "%s: %v", h.Address, err))
		}
	}
	return f.Join(errs...)
}

// Steps binds the VM's host devices to vfio-pci, after recording (root
// only, in the VM's records) the drivers they had, so a down, or the next
// start, gives them back even after vmsup died in between. The unit may
// lock the guest's memory: VFIO pins all of it (libvirt's limit: the
// memory and 1 GiB).
func (m Manager) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	vm := &f.VM
	if len(vm.HostDevs) == 0 {
		return nil
	}
	plan.AddUnit(func(u *units.Unit) { u.MemLock = uint64(vm.MaxMemory) + 1<<30 })
	return []steps.Step{{Name: Step, Do: func(ctx context.Context) error {
		// A run that was never torn down left its devices on vfio-pci.
		if err := m.Teardown(vm.Name, plan.Paths.HostDevs()); err != nil {
			return fmt.Errorf("host devices left by a previous run: %w", err)
		}
		if err := m.Check(f); err != nil {
			return err
		}
		var addrs []string
		for _, d := range vm.HostDevs {
			addrs = append(addrs, d.Address)
		}
		if err := m.VFIO.Take(plan.Paths.HostDevs(), addrs); err != nil {
			return fmt.Errorf("hostdev: %w", err)
		}
		m.Logger.Info("host devices bound to vfio-pci", "vm", vm.Name, "addresses", addrs)
		return nil
	}, Undo: func(context.Context) {
		if err := m.Teardown(vm.Name, plan.Paths.HostDevs()); err != nil {
			m.Logger.Warn("give back host devices", "vm", vm.Name, "err", err)
		}
	}}}
}

// Teardown gives VM vm's host devices back to the drivers its record
// names (vfio.Host.GiveBack); idempotent.
func (m Manager) Teardown(vm, record string) error {
	if err := m.VFIO.GiveBack(record); err != nil {
		return fmt.Errorf("vm %q: host devices: %w", vm, err)
	}
	return nil
}
