package machine

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

// Confiner is the confinement manager for this supervisor's options and
// host.
func (s *Env) Confiner() *confine.Manager {
	return &confine.Manager{Root: s.opts.Root, QEMUUser: s.opts.QEMUUser, QEMU: s.opts.QEMU, Self: s.opts.Self,
		ImageDirs: append(slices.Clip(s.opts.ImageDirs), imagestore.Dir(s.opts.Root)), AppArmorUnusable: s.hostFacts().AppArmorUnusable, VFIO: s.VFIO(), Logger: s.opts.Logger,
		Hugetlbfs: hugepages.Host{}.DirOf, OpenDisk: s.OpenDisk, DiskPlace: s.Places().DiskPlace, OpenFile: s.Places().OpenFile}
}

// OpenDisk opens d's image and chain beneath this host's places and checks
// the objects (places.Places.OpenDisk); nil, nil for a disk with no
// image file of its own to open.
func (s *Env) OpenDisk(ctx context.Context, d spec.Disk) (*storage.OpenedDisk, error) {
	o, err := s.Places().OpenDisk(ctx, d)
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
func (s *Env) ConfinePaths(ctx context.Context, name string, rules ...units.PathRule) error {
	return s.Confiner().Extend(ctx, name, rules...)
}

// ReleasePaths undoes ConfinePaths after a device was detached.
func (s *Env) ReleasePaths(ctx context.Context, name string, paths ...string) error {
	return s.Confiner().Shrink(ctx, name, paths...)
}

// AppArmorProfile returns the AppArmor profile vmsup loads for f where the
// kernel has AppArmor (disks with their backing chains, boot files, the
// state directory), whatever this host has.
func (s *Env) AppArmorProfile(ctx context.Context, f *spec.File) (*units.Profile, error) {
	accel, _, _, _ := s.resolveHost(f)
	return s.Confiner().Profile(ctx, f, s.Paths(f.VM.Name), accel)
}

// ConfinementStatus reads what confines the running VM; detail measures
// the unit's exposure too (a systemd-analyze run).
func (s *Env) ConfinementStatus(ctx context.Context, sd *units.Manager, name, unit string, mainPID uint32, detail bool) *Confinement {
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
	return s.Confiner().Status(ctx, sd, name, unit, mainPID, sandboxOn, analyze)
}
