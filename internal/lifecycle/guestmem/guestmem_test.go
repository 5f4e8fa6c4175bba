package guestmem

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/host/hugepages"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// TestReuse: a local migration's new QEMU maps its memory in the VM's
// directory on the mount of its page size, recorded; a VM without
// hugepages has no step and nothing to reuse; a mount gone is the
// hugepages key's error.
func TestReuse(t *testing.T) {
	root := t.TempDir()
	mountinfo := filepath.Join(root, "proc/self/mountinfo")
	os.MkdirAll(filepath.Dir(mountinfo), 0o755)
	os.WriteFile(mountinfo, []byte("41 24 0:40 / /dev/hugepages rw - hugetlbfs hugetlbfs rw,pagesize=2M\n"), 0o644)
	m := Manager{Host: hugepages.Host{Root: root}}

	f := &spec.File{Path: "/vm.toml", VM: spec.VM{Name: "web"}}
	var plan startplan.Plan
	if m.Steps(f, &plan) != nil || m.Reuse(f, &plan) != nil || len(plan.ArgvOptions()) != 0 {
		t.Fatal("a VM without hugepages got something")
	}
	f.VM.Hugepages = spec.Hugepages2M
	if err := m.Reuse(f, &plan); err != nil {
		t.Fatal(err)
	}
	var o qemuargs.Options
	for _, fn := range plan.ArgvOptions() {
		fn(&o)
	}
	if o.Hugetlbfs != "/dev/hugepages/vmsup-web" || plan.Hugetlbfs != o.Hugetlbfs {
		t.Errorf("argv %q, recorded %q", o.Hugetlbfs, plan.Hugetlbfs)
	}
	f.VM.Hugepages = spec.Hugepages1G
	if err := m.Reuse(f, &plan); err == nil || !strings.Contains(err.Error(), "hugepages") {
		t.Errorf("no 1G mount: %v", err)
	}
}
