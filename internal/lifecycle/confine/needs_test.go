package confine

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// A VM with vsock and hugepages needs /dev/vhost-vsock and the hugetlbfs
// mount (a directory: MOUNT/** in the profile), and its unit sees the mount
// writable.
func TestNeedsVsockHugepages(t *testing.T) {
	m := &Manager{Self: "/usr/bin/vmsup", QEMU: "/usr/bin/qemu-system-x86_64",
		Hugetlbfs: func(vm *spec.VM) (string, error) {
			if vm.HugepageSize() != 2*spec.MiB {
				t.Errorf("asked for page size %s", vm.HugepageSize())
			}
			return "/dev/hugepages", nil
		}}
	f := &spec.File{Path: "/x/v.toml", VM: spec.VM{Name: "v", Memory: 512 * spec.MiB, Hugepages: "2M",
		Vsock: spec.Vsock{Enabled: true}}}
	p := vmstore.Paths{Dir: "/var/lib/vmsup/vms/v"}
	ns, err := m.vmNeeds(context.Background(), f, p, spec.AccelTCG)
	if err != nil {
		t.Fatal(err)
	}
	has := func(path, mode string) bool {
		return slices.ContainsFunc(ns, func(n need) bool { return n.path == path && n.mode == mode })
	}
	if !has("/dev/vhost-vsock", "rw") || !has("/dev/hugepages/", "rw") {
		t.Fatalf("needs %+v lack /dev/vhost-vsock rw or /dev/hugepages/ rw", ns)
	}
	prof, err := m.buildProfile(&f.VM, p, ns)
	if err != nil {
		t.Fatal(err)
	}
	text, err := prof.Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"/dev/hugepages/**" rw,`, `"/dev/vhost-vsock" rw,`} {
		if !strings.Contains(string(text), want) {
			t.Errorf("profile lacks %s:\n%s", want, text)
		}
	}
	sb := m.Sandbox(f, p, &Record{User: "vmsupq-x"})
	if !slices.Contains(sb.ReadWritePaths, "/dev/hugepages") || !slices.Contains(sb.BindPaths, "/dev/hugepages") {
		t.Errorf("sandbox %+v does not make /dev/hugepages writable", sb)
	}
	f.VM.Hugepages, f.VM.Vsock = "", spec.Vsock{}
	if ns, _ := m.vmNeeds(context.Background(), f, p, spec.AccelTCG); len(ns) != 2 {
		t.Errorf("a VM without them needs %+v", ns)
	}
}
