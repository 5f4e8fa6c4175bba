package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/internal/devices"
	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// Recovery of interrupted hot-plugs and resizes (journal.go): what QEMU
// has is the truth. A device that made it into QEMU is adopted (recorded);
// parts of one that did not are removed, with their grants and the files
// the operation made.

// diskIntent is a disk hot-plug's, attach or detach: the disk, where it
// goes, and every part of it QEMU may have.
type diskIntent struct {
	Disk     spec.Disk `json:"disk"`
	Bus      string    `json:"bus"`
	NewImage bool      `json:"new_image,omitempty"` // the image did not exist: the attach creates it
	Devices  []string  `json:"devices"`
	Nodes    []string  `json:"nodes"`
	Objects  []string  `json:"objects"`
	Rules    []string  `json:"rules,omitempty"`     // paths granted to QEMU's user
	FromFile bool      `json:"from_file,omitempty"` // a disk of the VM's file (apply): recorded in its spec
}

func newDiskIntent(d spec.Disk, bus string) diskIntent {
	in := diskIntent{Disk: d, Bus: bus}
	if d.Type == spec.DiskFile {
		_, err := os.Stat(d.File)
		in.NewImage = errors.Is(err, os.ErrNotExist)
	}
	// The parts' ids do not depend on the host files.
	if parts, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: "/dev/null", SecretFile: "/dev/null"}, bus); err == nil {
		for _, x := range parts.Devices {
			in.Devices = append(in.Devices, x.ID)
		}
		for _, x := range parts.Blockdevs {
			in.Nodes = append(in.Nodes, x.NodeName)
		}
		for _, x := range parts.Objects {
			in.Objects = append(in.Objects, x.ID)
		}
	}
	return in
}

func rulePaths(rules []units.PathRule) []string {
	paths := make([]string, len(rules))
	for i, r := range rules {
		paths[i] = r.Path
	}
	return paths
}

// nicIntent is a NIC hot-plug's.
type nicIntent struct {
	NIC      spec.NIC `json:"nic"`
	FromFile bool     `json:"from_file,omitempty"` // a NIC of the VM's file (apply)
	Bus      string   `json:"bus,omitempty"`
	Netdev   string   `json:"netdev"`
	Device   string   `json:"device"`
}

// liveQMP is the running VM's monitor, or nil (no error) when QEMU is gone.
func (s *Supervisor) liveQMP(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	if _, err := os.Stat(s.paths(name).QMP); err != nil {
		return nil, func() {}, nil
	}
	return s.qmpSession(ctx, name)
}

func (s *Supervisor) recoverDiskAttach(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := intentOf[diskIntent](op)
	if err != nil {
		return "", err
	}
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return "", err
	}
	if hasDisk(app, in.Disk.Name) {
		return fmt.Sprintf("disk %q was attached and recorded", in.Disk.Name), nil
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
		if len(in.Devices) > 0 && pr.Devices[in.Devices[0]] {
			// It made it into the guest: keep it, as the attach meant to.
			a := AttachedDisk{Disk: in.Disk, Bus: in.Bus}
			if id, ok := pr.FDSets[devices.FDOpaque(in.Disk.Name)]; ok {
				a.FDSet = &id
			}
			if err := recordDisk(app, a, in.FromFile); err != nil {
				return "", err
			}
			if err := s.state.RewriteApplied(app); err != nil {
				return "", fmt.Errorf("record: %w", err)
			}
			return fmt.Sprintf("disk %q was plugged: adopted and recorded", in.Disk.Name), nil
		}
		if err := s.removeParts(ctx, c, pr, in); err != nil {
			return "", err
		}
	}
	s.undoDiskHost(ctx, name, in)
	return fmt.Sprintf("disk %q had not reached the guest: its parts, grants and files are removed", in.Disk.Name), nil
}

func (s *Supervisor) recoverDiskDetach(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := intentOf[diskIntent](op)
	if err != nil {
		return "", err
	}
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return "", err
	}
	if !hasDisk(app, in.Disk.Name) {
		return fmt.Sprintf("disk %q was detached and recorded", in.Disk.Name), nil
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
		if len(in.Devices) > 0 && pr.Devices[in.Devices[0]] {
			// The detach was meant: finish the unplug it may have begun.
			gone, err := devices.FinishUnplug(ctx, c, in.Devices[0], s.opts.UnplugTimeout)
			if err != nil {
				return "", err
			}
			if !gone {
				return fmt.Sprintf("disk %q is still in the guest (it did not release it): it stays attached; detach it again", in.Disk.Name), nil
			}
			if pr, err = devices.Query(ctx, c); err != nil {
				return "", err
			}
		}
		if err := s.removeParts(ctx, c, pr, in); err != nil {
			return "", err
		}
	}
	if err := s.ReleasePaths(ctx, name, in.Rules...); err != nil {
		return "", err
	}
	if err := s.forgetDisk(name, app, in.Disk.Name); err != nil {
		return "", err
	}
	return fmt.Sprintf("disk %q had left the guest: detach finished", in.Disk.Name), nil
}

// removeParts removes what QEMU has of a disk that is not in the guest:
// nodes top first, objects, its fd set.
func (s *Supervisor) removeParts(ctx context.Context, c *qmp.Conn, pr devices.Present, in diskIntent) error {
	var errs []error
	for i := len(in.Devices) - 1; i >= 0; i-- {
		if pr.Devices[in.Devices[i]] {
			errs = append(errs, devices.Unplug(ctx, c, "disk", in.Devices[i], s.opts.UnplugTimeout))
		}
	}
	for i := len(in.Nodes) - 1; i >= 0; i-- {
		if pr.Nodes[in.Nodes[i]] {
			errs = append(errs, c.BlockdevDel(ctx, in.Nodes[i]))
		}
	}
	for i := len(in.Objects) - 1; i >= 0; i-- {
		if pr.Objects[in.Objects[i]] {
			errs = append(errs, c.ObjectDel(ctx, in.Objects[i]))
		}
	}
	if id, ok := pr.FDSets[devices.FDOpaque(in.Disk.Name)]; ok {
		errs = append(errs, c.RemoveFD(ctx, id, nil))
	}
	return errors.Join(errs...)
}

// undoDiskHost takes back a rolled-back attach's host side: its grants, the
// secret copy and seed it made, and the image it created.
func (s *Supervisor) undoDiskHost(ctx context.Context, name string, in diskIntent) {
	if len(in.Rules) > 0 {
		if err := s.ReleasePaths(ctx, name, in.Rules...); err != nil {
			s.opts.Logger.Warn("recover: release grants", "vm", name, "err", err)
		}
	}
	dir := s.paths(name).Dir
	_ = storage.RemoveSecret(dir, in.Disk.Name)
	if in.Disk.Type == spec.DiskSeed {
		os.Remove(storage.SeedPath(dir, in.Disk.Name))
	}
	if in.NewImage && in.Disk.File != "" {
		os.Remove(in.Disk.File) // the attach made it: nothing else can have written it
	}
}

func (s *Supervisor) recoverNICAttach(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := intentOf[nicIntent](op)
	if err != nil {
		return "", err
	}
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return "", err
	}
	if hasNIC(app, in.NIC.Name) {
		return fmt.Sprintf("nic %q was attached and recorded", in.NIC.Name), nil
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
			if err := recordNIC(app, in.NIC, in.FromFile); err != nil {
				return "", err
			}
			if err := s.state.RewriteApplied(app); err != nil {
				return "", fmt.Errorf("record: %w", err)
			}
			return fmt.Sprintf("nic %q was plugged: adopted and recorded", in.NIC.Name), nil
		}
		if err := c.NetdevDel(ctx, in.Netdev); err != nil && !qmp.IsClass(err, qmp.ClassDeviceNotFound) {
			return "", fmt.Errorf("netdev_del %s: %w", in.Netdev, err)
		}
	}
	if err := s.net().Forget(ctx, name, in.NIC.Name); err != nil {
		return "", err
	}
	return fmt.Sprintf("nic %q had not reached the guest: its backend and tap are removed", in.NIC.Name), nil
}

func (s *Supervisor) recoverNICDetach(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := intentOf[nicIntent](op)
	if err != nil {
		return "", err
	}
	app, err := s.state.ReadApplied(name)
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
			gone, err := devices.FinishUnplug(ctx, c, in.Device, s.opts.UnplugTimeout)
			if err != nil {
				return "", err
			}
			if !gone {
				return fmt.Sprintf("nic %q is still in the guest (it did not release it): it stays attached; detach it again", in.NIC.Name), nil
			}
		}
		if err := c.NetdevDel(ctx, in.Netdev); err != nil && !qmp.IsClass(err, qmp.ClassDeviceNotFound) {
			return "", fmt.Errorf("netdev_del %s: %w", in.Netdev, err)
		}
	}
	if err := s.net().Forget(ctx, name, in.NIC.Name); err != nil {
		return "", err
	}
	if err := dropNIC(app, in.NIC.Name); err != nil {
		return "", err
	}
	if err := s.state.RewriteApplied(app); err != nil {
		return "", fmt.Errorf("record: %w", err)
	}
	return fmt.Sprintf("nic %q had left the guest: detach finished", in.NIC.Name), nil
}

func (s *Supervisor) recoverResize(ctx context.Context, name string, _ *operation.Op) (string, error) {
	v, err := s.view(name)
	if errors.Is(err, ErrNotRunning) {
		return "QEMU is gone: nothing to reconcile", nil
	}
	if err != nil {
		return "", err
	}
	app, vm := v.Applied, v.Booted
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	cpus, mem, err := s.recordResize(ctx, c, app, vm)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("recorded what QEMU has: %d vCPUs, %s", cpus, mem), nil
}

// restartIntent is a restart's: the file it applies.
type restartIntent struct {
	File string `json:"file"`
	Raw  []byte `json:"raw"`
}

// recoverRestart finishes a restart whose command died: the VM is taken
// down if that had not been done (a graceful stop may have been under way:
// it is finished, not left to power the guest off later), then started (with
// the new file if it still parses, else with the spec it ran with), unless
// the recovering command takes it down anyway. A restart that got as far as
// starting QEMU is done.
func (s *Supervisor) recoverRestart(ctx context.Context, name string, op *operation.Op) (string, error) {
	by := op.SettledBy()
	sd, err := s.systemd(ctx)
	if err != nil {
		return "", err
	}
	unit := s.state.UnitOf(name)
	st, err := sd.Status(ctx, unit)
	if err != nil {
		return "", err
	}
	switch {
	case op.Has(StepUnit) && !st.Gone():
		return "the VM runs", nil
	case by == "down" || by == "rm":
		return "left for " + by, nil
	}
	if !op.Has(restartDown) && !st.Gone() {
		if _, err := s.down(ctx, name, &lockedUnit{sd: sd, unit: unit, st: st}, DownOptions{}); err != nil {
			return "", err
		}
	}
	f, err := s.appliedFile(name)
	if in, ierr := intentOf[restartIntent](op); ierr == nil {
		if nf, perr := spec.Parse(in.File, in.Raw); perr == nil && nf.VM.Name == name {
			f, err = nf, nil
		}
	}
	if err != nil {
		return "", err
	}
	if _, err := s.startLocked(ctx, f, nil); err != nil {
		return "", err
	}
	return "the restart is finished: started from " + f.Path, nil
}
