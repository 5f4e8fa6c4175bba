package machine

import (
	"context"
	"errors"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/host/hugepages"
	"github.com/vmsup/vmsup/internal/host/vfio"
	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/diskprep"
	"github.com/vmsup/vmsup/internal/lifecycle/guestmem"
	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/lifecycle/passthrough"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/vsock"
	"github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// The concerns of a start live in their own packages, each a
// startplan.Contributor: its steps with their undo, and its argv and unit
// options as data in the start's plan (start.go applies them). Here they
// are listed in the order their steps run, with what each needs of the
// supervisor, and torn down once QEMU is gone.

// HostConcerns make the host ready for QEMU, between the state-dir and
// argv steps; a local migration destination runs none of their steps and
// reuses what the running QEMU's made (startplan.Reuse). Making the list
// touches nothing: StartSteps lists a start without running it.
func (s *Env) HostConcerns() []startplan.Contributor {
	return []startplan.Contributor{
		guestmem.Manager{QEMUUser: func(ctx context.Context, vm string) (string, uint32, uint32, error) {
			return s.Confiner().Identity(ctx, vm)
		}},
		vsock.Start{Allocator: s.vsocks()},
		s.Images(), // before the storage step: it makes image disks' overlays
		s.disks(),
		identity.Credentials{},
		nics.Start{Manager: s.Net(), StopPost: append([]string{s.opts.Self, HookPost, "--root", s.opts.Root}, s.startFlags()...), Owner: s.TapOwner},
		s.hostDevs(), // before confine: it grants the nodes binding makes
		confine.Start{Manager: s.Confiner},
	}
}

// companions start the units that serve QEMU from outside it (the console
// logger, swtpm, virtiofsd), after the record step.
func (s *Env) companions() companion.Companions {
	return companion.Companions{Self: s.opts.Self, Systemd: s.Systemd, LastWords: s.LastWords,
		Confinement: func(vm string) (*confine.Record, error) { return s.Confiner().Read(vm) }}
}

// hostTeardown releases what the host concerns' steps set up once QEMU is
// gone (after Down, a crash, or a stop through systemd). It must be
// idempotent.
func (s *Env) hostTeardown(ctx context.Context, name string) error {
	p := s.Paths(name)
	return errors.Join(
		s.Net().Teardown(ctx, name, false),
		s.hostDevs().Teardown(name, p.HostDevs()),
		s.Confiner().Teardown(ctx, name),
		diskprep.Teardown(p.Dir),
		identity.RemoveCredentials(p.Dir),
		hugepages.Host{}.RemoveVMDirs(name),
	)
}

func (s *Env) disks() diskprep.Manager {
	return diskprep.Manager{Store: s.state, Tools: s.Tools(), CheckPaths: s.CheckDiskPaths}
}

func (s *Env) Images() imagestore.Start {
	return imagestore.Start{Store: imagestore.Store{Dir: imagestore.Dir(s.opts.Root), Tools: s.Tools()}}
}

func (s *Env) Tools() storage.Tools { return storage.Tools{} }

// vsocks is the root's CID table (internal/lifecycle/vsock).
func (s *Env) vsocks() vsock.Allocator { return vsock.ForRoot(s.opts.Root) }

// VFIO is this supervisor's host for PCI passthrough.
func (s *Env) VFIO() vfio.Host { return vfio.Host{Sys: s.opts.SysRoot, Dev: s.opts.DevRoot} }

func (s *Env) hostDevs() passthrough.Manager {
	return passthrough.Manager{VFIO: s.VFIO(), Logger: s.opts.Logger}
}

// guestArgv fills what an argv shown or checked outside a start needs
// (a start's steps set both): the CID the VM has or would get, the
// hugepages' directory.
func (s *Env) guestArgv(vm *spec.VM, o *qemuargs.Options) error {
	if vm.Vsock.On() && o.VsockCID == 0 {
		cid, err := s.vsocks().Peek(vm.Name, uint32(vm.Vsock.CID))
		if err != nil {
			return err
		}
		o.VsockCID = cid
	}
	if vm.Hugepages != "" && o.Hugetlbfs == "" {
		dir, err := hugepages.Host{}.DirOf(vm)
		if err != nil {
			return err
		}
		o.Hugetlbfs = dir
	}
	return nil
}

// ConsoleConfig is the console log of the VM as it was last started (the
// defaults when there is no record).
func (s *Env) ConsoleConfig(name string) consolelog.Config {
	var vm *spec.VM
	if v, _ := s.View(name); v != nil {
		vm = v.Booted
	}
	return companion.Config(s.Paths(name), vm)
}
