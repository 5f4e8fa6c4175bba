package supervisor

import (
	"bytes"
	"fmt"

	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Export is the VM file of VM name as it runs now (its view): the spec QEMU
// realizes with apply's changes, the live vCPUs and memory, and each disk
// of its file where it is now (after disk moves). Disks and NICs attached
// by hand are not in it (a comment names them: the next up boots with the
// disks anyway). up, plan and apply of the exported file find the VM in
// sync, once the file is its own (--adopt, or written over the old one).
func (s *Supervisor) Export(name string) ([]byte, error) {
	v, err := s.env.View(name)
	if v == nil {
		return nil, vmerr.Wrap(name, err)
	}
	return exportTOML(v)
}

func exportTOML(v *vmstore.View) ([]byte, error) {
	vm := *v.Spec
	vm.Disks = nil
	if a := v.Applied; a != nil && spec.MachineVersioned(a.Machine) {
		vm.Machine = a.Machine // the pinned type: the file moves no VM to another
	}
	var notes []string
	for _, d := range v.Disks {
		switch {
		case d.Attached:
			notes = append(notes, fmt.Sprintf("disk %q (attached with vmsup disk attach)", d.Name))
		default:
			vm.Disks = append(vm.Disks, d.Disk)
		}
	}
	for _, n := range v.NICs {
		if n.Attached {
			notes = append(notes, fmt.Sprintf("nic %q (attached with vmsup nic attach)", n.Name))
		}
	}
	f, err := spec.New(vm.Name, vm)
	if err != nil {
		return nil, vmerr.Wrap(vm.Name, fmt.Errorf("export: %w", err))
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# VM %q as it runs, written by vmsup export.\n", vm.Name)
	for _, n := range notes {
		fmt.Fprintf(&b, "# Not in this file: %s.\n", n)
	}
	b.Write(f.Raw)
	return b.Bytes(), nil
}
