// Package guestmem is the host side of a guest's memory at its start: for
// a VM with hugepages, the check that their mount and free pages are there
// before anything else is made, and the VM's own directory on the mount,
// owned by its QEMU's user. The host's hugetlbfs facts are
// internal/host/hugepages' (kept below qemuargs, whose tests read them).
package guestmem

import (
	"context"

	"github.com/vmsup/vmsup/internal/host/hugepages"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// Step is the start step that checks the pages and makes the VM's
// directory on their mount.
const Step = "hugepages"

// Manager is the guest memory's part of the starts under one state root.
type Manager struct {
	Host hugepages.Host
	// QEMUUser is the user the VM's QEMU runs as, who owns its directory.
	QEMUUser func(ctx context.Context, vm string) (name string, uid, gid uint32, err error)
}

var (
	_ startplan.Contributor = Manager{}
	_ startplan.Reuser      = Manager{}
)

// Steps is the hugepages step of a VM with hugepages: the VM's directory on
// their mount, removed again on a failed start.
func (m Manager) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	vm := &f.VM
	if vm.Hugepages == "" {
		return nil
	}
	return []steps.Step{{Name: Step, Do: func(ctx context.Context) error {
		mount, err := m.Host.Check(vm)
		if err != nil {
			return f.Errorf("hugepages", "%v", err)
		}
		_, uid, gid, err := m.QEMUUser(ctx, vm.Name)
		if err != nil {
			return err
		}
		dir, err := hugepages.MakeVMDir(mount, vm.Name, int(uid), int(gid))
		if err != nil {
			return err
		}
		plan.Hugetlbfs = dir
		plan.AddArgv(func(o *qemuargs.Options) { o.Hugetlbfs = dir })
		return nil
	}, Undo: func(context.Context) { _ = m.Host.RemoveVMDirs(vm.Name) }}}
}

// Reuse: a local migration's new QEMU maps its memory on the same mount;
// the running QEMU's pages stay its own.
func (m Manager) Reuse(f *spec.File, plan *startplan.Plan) error {
	if f.VM.Hugepages == "" {
		return nil
	}
	dir, err := m.Host.DirOf(&f.VM)
	if err != nil {
		return f.Errorf("hugepages", "%v", err)
	}
	plan.Hugetlbfs = dir
	plan.AddArgv(func(o *qemuargs.Options) { o.Hugetlbfs = dir })
	return nil
}
