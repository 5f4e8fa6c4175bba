package supervisor

import (
	"context"
	"errors"
	"slices"

	"github.com/vmsup/vmsup/internal/host/hugepages"
	"github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// Confinement lives in internal/lifecycle/confine; these are the supervisor's handles
// on it and the exported API that predates the move.

// DefaultQEMUUser is the default Options.QEMUUser: PerVMUser.
const DefaultQEMUUser = confine.DefaultQEMUUser

// SharedQEMUUser as Options.QEMUUser runs every VM's QEMU as one user.
const SharedQEMUUser = confine.SharedQEMUUser

// PerVMUser as Options.QEMUUser gives each VM its own system user.
const PerVMUser = confine.PerVMUser

// Confinement is the confinement in force for a running VM, as systemd,
// the kernel and vmsup's record say.
type Confinement = confine.Status

// confiner is the confinement manager for this supervisor's options and
// host.
func (s *Supervisor) confiner() *confine.Manager {
	return &confine.Manager{Root: s.opts.Root, QEMUUser: s.opts.QEMUUser, QEMU: s.opts.QEMU, Self: s.opts.Self,
		ImageDirs: append(slices.Clip(s.opts.ImageDirs), imagestore.Dir(s.opts.Root)), AppArmorUnusable: s.hostFacts().AppArmorUnusable, VFIO: s.vfio(), Logger: s.opts.Logger,
		Hugetlbfs: hugepages.Host{}.DirOf, OpenDisk: s.openDisk, DiskPlace: s.places().DiskPlace, OpenFile: s.places().OpenFile}
}

// openDisk opens d's image and chain beneath this host's places and checks
// the objects (places.Places.OpenDisk); nil, nil for a disk with no
// image file of its own to open.
func (s *Supervisor) openDisk(ctx context.Context, d spec.Disk) (*storage.OpenedDisk, error) {
	o, err := s.places().OpenDisk(ctx, d)
	if errors.Is(err, places.ErrNoObject) {
		return nil, nil
	}
	return o, err
}

// ConfinePaths extends a running VM's confinement by files it is about to
// use (a hot-plugged disk and its backing chain): the QEMU user gets access
// and the AppArmor profile, if loaded, is reloaded with them, before the
// device is added. The unit's mount namespace is fixed at start, so a
// hot-plugged file must lie under a path the unit already sees (an image
// directory, not /tmp or /home).
func (s *Supervisor) ConfinePaths(ctx context.Context, name string, rules ...units.PathRule) error {
	return s.confiner().Extend(ctx, name, rules...)
}

// ReleasePaths undoes ConfinePaths after a device was detached.
func (s *Supervisor) ReleasePaths(ctx context.Context, name string, paths ...string) error {
	return s.confiner().Shrink(ctx, name, paths...)
}

// AppArmorProfile returns the AppArmor profile vmsup loads for f where the
// kernel has AppArmor (disks with their backing chains, boot files, the
// state directory), whatever this host has.
func (s *Supervisor) AppArmorProfile(ctx context.Context, f *spec.File) (*units.Profile, error) {
	accel, _, _, _ := s.resolveHost(f)
	return s.confiner().Profile(ctx, f, s.paths(f.VM.Name), accel)
}

// confinementStatus reads what confines the running VM; detail measures
// the unit's exposure too (a systemd-analyze run).
func (s *Supervisor) confinementStatus(ctx context.Context, sd *units.Manager, name, unit string, mainPID uint32, detail bool) *Confinement {
	sandboxOn := false
	if app, err := s.state.ReadApplied(name); err == nil {
		sandboxOn = slices.Contains(app.Argv, "-sandbox")
	}
	var analyze func(context.Context) (units.Exposure, error)
	if detail {
		analyze = func(ctx context.Context) (units.Exposure, error) {
			return units.AnalyzeSecurity(ctx, s.opts.SystemdAnalyze, s.opts.SystemdBus, unit)
		}
	}
	return s.confiner().Status(ctx, sd, name, unit, mainPID, sandboxOn, analyze)
}
