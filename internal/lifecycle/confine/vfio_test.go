package confine

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmsup/vmsup/internal/host/vfio"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// TestHostDevNeeds: a VM's host devices add the VFIO container and their
// group's node (once for two devices of one group) to what its QEMU needs,
// so they get their ACL, AppArmor rule and unit DeviceAllow=, against a
// fake sysfs (this host has no IOMMU).
func TestHostDevNeeds(t *testing.T) {
	root := t.TempDir()
	sys, dev := filepath.Join(root, "sys"), filepath.Join(root, "dev")
	for _, addr := range []string{"0000:01:00.0", "0000:01:00.1"} {
		d := filepath.Join(sys, "bus/pci/devices", addr)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(sys, "kernel/iommu_groups/12"), filepath.Join(d, "iommu_group")); err != nil {
			t.Fatal(err)
		}
	}
	f, err := spec.Parse("/t/g.toml", []byte("name = \"g\"\nmemory = \"64M\"\naccel = \"tcg\"\n[boot]\nkernel = \"/k\"\n"+
		"[[hostdev]]\naddress = \"01:00.0\"\n[[hostdev]]\naddress = \"01:00.1\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{Root: root, Self: "/bin/true", QEMU: "/usr/bin/qemu-system-x86_64", VFIO: vfio.Host{Sys: sys, Dev: dev}}
	p := vmstore.Store{Root: root}.Paths("g")
	ns, err := m.vmNeeds(context.Background(), f, p, spec.AccelTCG)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range ns {
		if n.field == "/t/g.toml: hostdev" && n.mode == "rw" {
			got = append(got, n.path)
		}
	}
	want := []string{filepath.Join(dev, "vfio/vfio"), filepath.Join(dev, "vfio/12")}
	if !slices.Equal(got, want) {
		t.Errorf("hostdev needs %q, want %q", got, want)
	}
	prof, err := m.buildProfile(&f.VM, p, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(prof.Rules, units.PathRule{Path: w, Mode: "rw"}) {
			t.Errorf("AppArmor profile lacks %s rw: %+v", w, prof.Rules)
		}
	}
	// No IOMMU group: the needs say so instead of leaving the device out.
	os.Remove(filepath.Join(sys, "bus/pci/devices/0000:01:00.1/iommu_group"))
	if _, err := m.vmNeeds(context.Background(), f, p, spec.AccelTCG); err == nil {
		t.Error("vmNeeds passed for a device without an IOMMU group")
	}
}
