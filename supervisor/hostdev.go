package supervisor

import (
	"context"
	"fmt"

	"github.com/vmsup/vmsup/internal/vfio"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Host PCI devices ([[hostdev]]) live in internal/vfio; this is their part
// of a start and of the teardown. Hot-plugging one is internal/hotplug's.

// vfio is this supervisor's host for PCI passthrough.
func (s *Supervisor) vfio() vfio.Host { return vfio.Host{Sys: s.opts.SysRoot, Dev: s.opts.DevRoot} }

// checkHostDevs checks, touching nothing, that every host device is
// present and that its IOMMU group holds nothing the host still uses (the
// VM's other devices aside); an error names the field, one per device.
func (s *Supervisor) checkHostDevs(f *spec.File) error {
	var addrs []string
	for _, h := range f.VM.HostDevs {
		addrs = append(addrs, h.Address)
	}
	var errs []error
	for i, h := range f.VM.HostDevs {
		if f.Broken(fmt.Sprintf("hostdev[%d]", i)) {
			continue
		}
		if err := s.vfio().Check(h.Address, addrs); err != nil {
			errs = append(errs, f.Errorf(fmt.Sprintf("hostdev[%d].address", i), "%s: %v", h.Address, err))
		}
	}
	return f.Join(errs...)
}

// hostDevSteps binds the VM's host devices to vfio-pci, after recording
// (root only, in the VM's records) the drivers they had, so a down, or the
// next start, gives them back even after vmsup died in between. The unit may lock the guest's memory: VFIO
// pins all of it (libvirt's limit: the memory and 1 GiB).
func (s *Supervisor) hostDevSteps(f *spec.File, p vmstate.Paths, plan *startPlan) []step {
	vm := &f.VM
	if len(vm.HostDevs) == 0 {
		return nil
	}
	plan.unitOpts = append(plan.unitOpts, func(u *units.Unit) { u.MemLock = uint64(vm.MaxMemory) + 1<<30 })
	return []step{{Name: "hostdevs", Do: func(ctx context.Context) error {
		// A run that was never torn down left its devices on vfio-pci.
		if err := s.hostDevTeardown(vm.Name); err != nil {
			return fmt.Errorf("host devices left by a previous run: %w", err)
		}
		if err := s.checkHostDevs(f); err != nil {
			return err
		}
		var addrs []string
		for _, d := range vm.HostDevs {
			addrs = append(addrs, d.Address)
		}
		if err := s.vfio().Take(p.HostDevs(), addrs); err != nil {
			return fmt.Errorf("hostdev: %w", err)
		}
		s.opts.Logger.Info("host devices bound to vfio-pci", "vm", vm.Name, "addresses", addrs)
		return nil
	}, Undo: func(context.Context) {
		if err := s.hostDevTeardown(vm.Name); err != nil {
			s.opts.Logger.Warn("give back host devices", "vm", vm.Name, "err", err)
		}
	}}}
}

// hostDevTeardown gives the VM's host devices back to the drivers its
// record names (internal/vfio.GiveBack); idempotent.
func (s *Supervisor) hostDevTeardown(name string) error {
	if err := s.vfio().GiveBack(s.paths(name).HostDevs()); err != nil {
		return fmt.Errorf("vm %q: host devices: %w", name, err)
	}
	return nil
}
