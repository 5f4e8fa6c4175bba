package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/vmsup/vmsup/internal/hugepages"
	"github.com/vmsup/vmsup/internal/vsock"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// vsocks is the root's CID table (internal/vsock), with the kernel's view
// of CIDs held outside it.
func (s *Supervisor) vsocks() vsock.Allocator {
	return vsock.Allocator{Dir: filepath.Join(s.opts.Root, "vsock"), InUse: vsock.KernelInUse(vsock.Device)}
}

// hugetlbfs is the VM's directory on the hugetlbfs mount of its page
// size, where its QEMU maps the guest's memory.
func hugetlbfs(vm *spec.VM) (string, error) {
	mount, err := hugepages.Host{}.Mount(vm.HugepageSize())
	if err != nil {
		return "", err
	}
	return hugepages.VMDir(mount, vm.Name), nil
}

// guestSteps check and take what the guest's memory and vsock device need
// before anything else is made: free hugepages and their mount, the
// vhost-vsock device and a CID, allocated under the table's lock and kept
// for the VM until vmsup rm (so there is nothing to undo).
func (s *Supervisor) guestSteps(f *spec.File, plan *startPlan) []step {
	vm := &f.VM
	var steps []step
	if vm.Hugepages != "" {
		steps = append(steps, step{Name: "hugepages", Do: func(ctx context.Context) error {
			mount, err := hugepages.Host{}.Check(vm)
			if err != nil {
				return f.Errorf("hugepages", "%v", err)
			}
			_, uid, gid, err := s.confiner().Identity(ctx, vm.Name)
			if err != nil {
				return err
			}
			dir, err := hugepages.MakeVMDir(mount, vm.Name, int(uid), int(gid))
			if err != nil {
				return err
			}
			plan.hugetlbfs = dir
			plan.argvOpts = append(plan.argvOpts, func(o *qemuargs.Options) { o.Hugetlbfs = dir })
			return nil
		}, Undo: func(context.Context) { _ = hugepages.Host{}.RemoveVMDirs(vm.Name) }})
	}
	if vm.Vsock.On() {
		field := "vsock"
		if vm.Vsock.CID != 0 {
			field = "vsock.cid"
		}
		steps = append(steps, step{Name: "vsock", Do: func(ctx context.Context) error {
			if _, err := os.Stat(vsock.Device); err != nil {
				return f.Errorf("vsock", "%s is missing (modprobe vhost_vsock)", vsock.Device)
			}
			cid, err := s.vsocks().Acquire(ctx, vm.Name, uint32(vm.Vsock.CID))
			var inUse *vsock.InUseError
			if errors.As(err, &inUse) {
				return f.Errorf(field, "%v", err)
			}
			if err != nil {
				return f.Errorf(field, "allocate a CID: %v", err)
			}
			plan.vsockCID = cid
			plan.argvOpts = append(plan.argvOpts, func(o *qemuargs.Options) { o.VsockCID = cid })
			return nil
		}})
	}
	return steps
}

// guestArgv fills what an argv shown or checked outside a start needs
// (a start's steps set both): the CID the VM has or would get, the mount.
func (s *Supervisor) guestArgv(vm *spec.VM, o *qemuargs.Options) error {
	if vm.Vsock.On() && o.VsockCID == 0 {
		cid, err := s.vsocks().Peek(vm.Name, uint32(vm.Vsock.CID))
		if err != nil {
			return err
		}
		o.VsockCID = cid
	}
	if vm.Hugepages != "" && o.Hugetlbfs == "" {
		mount, err := hugetlbfs(vm)
		if err != nil {
			return err
		}
		o.Hugetlbfs = mount
	}
	return nil
}

// errLocalVsock: a migration on one host would need the CID twice at once.
var errLocalVsock = errors.New("vsock: a migration on one host cannot keep the guest's CID (the kernel lets one QEMU hold it): down and up the VM instead")
