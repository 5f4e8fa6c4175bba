package vfio

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeHost is a sysfs and /dev tree in a temp dir, and a fake kernel that
// records each write (relative to the sysfs root) and moves driver links
// as the kernel would.
type fakeHost struct {
	t      *testing.T
	root   string
	writes []string
	// probeIgnores makes drivers_probe bind nothing (vfio-pci refusing).
	probeIgnores bool
}

// pciDev is one fake device: its IOMMU group ("" none), driver, class.
type pciDev struct{ addr, group, driver, class string }

func newFake(t *testing.T, devs ...pciDev) *fakeHost {
	f := &fakeHost{t: t, root: t.TempDir()}
	f.mkdir("sys/kernel/iommu_groups")
	f.file("sys/bus/pci/drivers_probe", "")
	f.mkdir("dev/vfio")
	f.file("dev/vfio/vfio", "")
	for _, drv := range []string{"vfio-pci", "pci-stub", "e1000e", "snd_hda_intel", "pcieport"} {
		f.file("sys/bus/pci/drivers/"+drv+"/bind", "")
		f.file("sys/bus/pci/drivers/"+drv+"/unbind", "")
	}
	for _, d := range devs {
		dir := "sys/bus/pci/devices/" + d.addr
		class := d.class
		if class == "" {
			class = "0x020000" // an Ethernet controller
		}
		f.file(dir+"/class", class+"\n")
		f.file(dir+"/driver_override", "(null)\n")
		if d.driver != "" {
			f.link(dir+"/driver", "sys/bus/pci/drivers/"+d.driver)
		}
		if d.group != "" {
			f.link(dir+"/iommu_group", "sys/kernel/iommu_groups/"+d.group)
			f.mkdir("sys/kernel/iommu_groups/" + d.group + "/devices")
			f.link("sys/kernel/iommu_groups/"+d.group+"/devices/"+d.addr, dir)
		}
	}
	return f
}

func (f *fakeHost) path(rel string) string { return filepath.Join(f.root, rel) }

func (f *fakeHost) mkdir(rel string) {
	if err := os.MkdirAll(f.path(rel), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeHost) file(rel, content string) {
	f.mkdir(filepath.Dir(rel))
	if err := os.WriteFile(f.path(rel), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeHost) link(rel, target string) {
	f.mkdir(filepath.Dir(rel))
	os.Remove(f.path(rel))
	if err := os.Symlink(f.path(target), f.path(rel)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeHost) host() Host {
	return Host{Sys: f.path("sys"), Dev: f.path("dev"), Write: f.write}
}

// write is the fake kernel.
func (f *fakeHost) write(path, value string) error {
	rel, err := filepath.Rel(f.path("sys"), path)
	if err != nil || strings.HasPrefix(rel, "..") {
		f.t.Fatalf("write outside sysfs: %s", path)
	}
	if _, err := os.Stat(path); err != nil {
		return err // sysfs has no O_CREATE
	}
	f.writes = append(f.writes, rel+"="+value)
	addr := strings.TrimSpace(value)
	dev := "sys/bus/pci/devices/" + addr
	switch parts := strings.Split(rel, "/"); {
	case parts[len(parts)-1] == "driver_override":
		v := strings.TrimSpace(value)
		if v == "" {
			v = "(null)"
		}
		return os.WriteFile(path, []byte(v+"\n"), 0o644)
	case rel == "bus/pci/drivers_probe":
		ov, _ := os.ReadFile(f.path(dev + "/driver_override"))
		if _, bound := os.Lstat(f.path(dev + "/driver")); bound == nil || f.probeIgnores {
			return nil
		}
		if drv := strings.TrimSpace(string(ov)); drv != "(null)" {
			f.link(dev+"/driver", "sys/bus/pci/drivers/"+drv)
		}
	case parts[len(parts)-1] == "unbind":
		return os.Remove(f.path(dev + "/driver"))
	case parts[len(parts)-1] == "bind":
		f.link(dev+"/driver", "sys/bus/pci/drivers/"+parts[len(parts)-2])
	}
	return nil
}

func (f *fakeHost) driver(addr string) string {
	d, err := f.host().Driver(addr)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func TestCheck(t *testing.T) {
	const nic, audio, bridge = "0000:01:00.0", "0000:01:00.1", "0000:00:01.0"
	for _, c := range []struct {
		name    string
		devs    []pciDev
		with    []string
		noVFIO  bool
		want    error  // errors.Is
		wantMsg string // substring
	}{
		{name: "alone", devs: []pciDev{{nic, "1", "e1000e", ""}}},
		{name: "group member on vfio-pci, pci-stub, none, or a bridge",
			devs: []pciDev{{nic, "1", "e1000e", ""}, {audio, "1", "vfio-pci", ""}, {"0000:01:00.2", "1", "pci-stub", ""},
				{"0000:01:00.3", "1", "", ""}, {bridge, "1", "pcieport", "0x060400"}}},
		{name: "busy member passed through too", with: []string{audio},
			devs: []pciDev{{nic, "1", "e1000e", ""}, {audio, "1", "snd_hda_intel", ""}}},
		{name: "busy member", devs: []pciDev{{nic, "1", "e1000e", ""}, {audio, "1", "snd_hda_intel", ""}, {"0000:01:00.2", "1", "e1000e", ""}},
			want: ErrBusy, wantMsg: "IOMMU group 1: 0000:01:00.1 (snd_hda_intel), 0000:01:00.2 (e1000e); pass them through too, or unbind them"},
		{name: "not present", devs: []pciDev{{audio, "1", "", ""}}, want: ErrNotFound, wantMsg: "no such PCI device on this host"},
		{name: "no IOMMU", devs: []pciDev{{nic, "", "e1000e", ""}}, want: ErrNoIOMMU,
			wantMsg: "no IOMMU group (the host has no IOMMU enabled: intel_iommu=on / amd_iommu)"},
		{name: "no vfio-pci", noVFIO: true, devs: []pciDev{{nic, "1", "e1000e", ""}}, want: ErrNoDriver},
		{name: "a bridge", devs: []pciDev{{nic, "1", "pcieport", "0x060400"}}, wantMsg: "a PCI bridge"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, c.devs...)
			if c.noVFIO {
				os.RemoveAll(f.path("sys/bus/pci/drivers/vfio-pci"))
			}
			err := f.host().Check(nic, c.with)
			if c.want == nil && c.wantMsg == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Check passed, want an error")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("Check: %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.wantMsg) {
				t.Errorf("Check: %q does not contain %q", err, c.wantMsg)
			}
			if len(f.writes) > 0 {
				t.Errorf("Check wrote %v", f.writes)
			}
		})
	}
}

func TestBindRestore(t *testing.T) {
	const addr = "0000:01:00.0"
	f := newFake(t, pciDev{addr, "7", "e1000e", ""})
	h := f.host()
	b, err := h.Before(addr)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Binding{Address: addr, Driver: "e1000e"}); b != want {
		t.Fatalf("Before: %+v, want %+v", b, want)
	}
	if err := h.Bind(b); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"bus/pci/devices/0000:01:00.0/driver_override=vfio-pci",
		"bus/pci/drivers/e1000e/unbind=0000:01:00.0",
		"bus/pci/drivers_probe=0000:01:00.0",
	}
	if diff := cmp.Diff(want, f.writes); diff != "" {
		t.Errorf("Bind wrote (-want +got):\n%s", diff)
	}
	if d := f.driver(addr); d != DriverVFIO {
		t.Fatalf("after Bind: driver %q", d)
	}
	if err := h.Bind(b); err != nil || len(f.writes) != 3 {
		t.Errorf("Bind again: %v, writes %v", err, f.writes[3:])
	}

	f.writes = nil
	if err := h.Restore(b); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"bus/pci/devices/0000:01:00.0/driver_override=\n",
		"bus/pci/drivers/vfio-pci/unbind=0000:01:00.0",
		"bus/pci/drivers/e1000e/bind=0000:01:00.0",
	}
	if diff := cmp.Diff(want, f.writes); diff != "" {
		t.Errorf("Restore wrote (-want +got):\n%s", diff)
	}
	if d := f.driver(addr); d != "e1000e" {
		t.Errorf("after Restore: driver %q", d)
	}
	f.writes = nil
	if err := h.Restore(b); err != nil || len(f.writes) > 0 {
		t.Errorf("Restore again: %v, wrote %v", err, f.writes)
	}
}

func TestBindFailsGivesBack(t *testing.T) {
	const addr = "0000:01:00.0"
	f := newFake(t, pciDev{addr, "7", "e1000e", ""})
	f.probeIgnores = true
	h := f.host()
	b, _ := h.Before(addr)
	err := h.Bind(b)
	if err == nil || !strings.Contains(err.Error(), `bound to "" after the probe, not vfio-pci`) {
		t.Fatalf("Bind: %v", err)
	}
	if d := f.driver(addr); d != "e1000e" {
		t.Errorf("after a failed Bind: driver %q, want e1000e back", d)
	}
	if ov, _ := os.ReadFile(f.path("sys/bus/pci/devices/" + addr + "/driver_override")); string(ov) != "(null)\n" {
		t.Errorf("driver_override left %q", ov)
	}
}

func TestBindUnboundAndAlreadyVFIO(t *testing.T) {
	f := newFake(t, pciDev{"0000:02:00.0", "3", "", ""}, pciDev{"0000:03:00.0", "4", "vfio-pci", ""})
	h := f.host()
	unbound, _ := h.Before("0000:02:00.0")
	if err := h.Bind(unbound); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{
		"bus/pci/devices/0000:02:00.0/driver_override=vfio-pci",
		"bus/pci/drivers_probe=0000:02:00.0",
	}, f.writes); diff != "" {
		t.Errorf("Bind of an unbound device wrote (-want +got):\n%s", diff)
	}
	f.writes = nil
	if err := h.Restore(unbound); err != nil {
		t.Fatal(err)
	}
	if d := f.driver("0000:02:00.0"); d != "" {
		t.Errorf("an unbound device came back on %q", d)
	}
	f.writes = nil
	already, _ := h.Before("0000:03:00.0")
	if err := h.Bind(already); err != nil {
		t.Fatal(err)
	}
	if err := h.Restore(already); err != nil {
		t.Fatal(err)
	}
	if len(f.writes) > 0 || f.driver("0000:03:00.0") != DriverVFIO {
		t.Errorf("a device already on vfio-pci: wrote %v, driver %q", f.writes, f.driver("0000:03:00.0"))
	}
	// A device gone since (unplugged from the host): nothing to give back.
	if err := h.Restore(Binding{Address: "0000:09:00.0", Driver: "e1000e"}); err != nil {
		t.Errorf("Restore of a device that is gone: %v", err)
	}
}

func TestNodesAndAvailable(t *testing.T) {
	f := newFake(t, pciDev{"0000:01:00.0", "7", "e1000e", ""}, pciDev{"0000:01:00.1", "7", "", ""}, pciDev{"0000:02:00.0", "9", "", ""})
	h := f.host()
	got, err := h.Nodes([]string{"0000:01:00.0", "0000:01:00.1", "0000:02:00.0"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{f.path("dev/vfio/vfio"), f.path("dev/vfio/7"), f.path("dev/vfio/9")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Nodes (-want +got):\n%s", diff)
	}
	if err := h.Available(); err != nil {
		t.Errorf("Available: %v", err)
	}
	os.Remove(f.path("dev/vfio/vfio"))
	if err := h.Available(); err == nil || !strings.Contains(err.Error(), "modprobe vfio") {
		t.Errorf("Available without /dev/vfio/vfio: %v", err)
	}
	empty := newFake(t)
	if err := empty.host().Available(); !errors.Is(err, ErrNoIOMMU) {
		t.Errorf("Available without IOMMU groups: %v", err)
	}
}

// TestLive binds and gives back a real device: VMSUP_TEST_VFIO_DEVICE
// names a spare one (nothing of the host's on it or its group), on a host
// with an IOMMU and vfio-pci. The probe says why not otherwise.
func TestLive(t *testing.T) {
	var h Host
	if err := h.Available(); err != nil {
		t.Skipf("this host cannot pass PCI devices through: %v", err)
	}
	addr := os.Getenv("VMSUP_TEST_VFIO_DEVICE")
	if addr == "" {
		t.Skip("VMSUP_TEST_VFIO_DEVICE (a spare PCI device's address) is not set")
	}
	if err := h.Check(addr, nil); err != nil {
		t.Fatal(err)
	}
	b, err := h.Before(addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Bind(b); err != nil {
		t.Fatal(err)
	}
	if d, _ := h.Driver(addr); d != DriverVFIO {
		t.Errorf("after Bind: %q", d)
	}
	if err := h.Restore(b); err != nil {
		t.Fatal(err)
	}
	if d, _ := h.Driver(addr); d != b.Driver {
		t.Errorf("after Restore: %q, want %q", d, b.Driver)
	}
}

// TestTakeGiveBack: the record is written before any bind, so a GiveBack
// by another process (a down after vmsup died) restores from it alone; a
// Take that fails half way is undone by GiveBack.
func TestTakeGiveBack(t *testing.T) {
	const nic, gpu = "0000:01:00.0", "0000:02:00.0"
	f := newFake(t, pciDev{nic, "1", "e1000e", ""}, pciDev{gpu, "2", "", ""})
	record := filepath.Join(f.root, "records", "vm", "hostdev.json")
	var sawRecord bool
	h := f.host()
	h.Write = func(path, value string) error {
		if _, err := os.Stat(record); err == nil {
			sawRecord = true
		} else if len(f.writes) == 0 {
			t.Errorf("first write %s before the record exists", path)
		}
		return f.write(path, value)
	}
	if err := h.Take(record, []string{nic, gpu}); err != nil {
		t.Fatal(err)
	}
	if !sawRecord || f.driver(nic) != DriverVFIO || f.driver(gpu) != DriverVFIO {
		t.Fatalf("after Take: record seen %v, drivers %q %q", sawRecord, f.driver(nic), f.driver(gpu))
	}
	data, _ := os.ReadFile(record)
	if !strings.Contains(string(data), `"driver": "e1000e"`) {
		t.Errorf("record:\n%s", data)
	}
	if err := f.host().GiveBack(record); err != nil { // a fresh Host: only the record
		t.Fatal(err)
	}
	if f.driver(nic) != "e1000e" || f.driver(gpu) != "" {
		t.Errorf("after GiveBack: %q %q", f.driver(nic), f.driver(gpu))
	}
	if _, err := os.Stat(record); err == nil {
		t.Error("record kept after GiveBack")
	}
	if err := f.host().GiveBack(record); err != nil {
		t.Errorf("GiveBack without a record: %v", err)
	}

	// The second device refuses vfio-pci: the first is given back by the undo.
	h.Write = func(path, value string) error {
		f.probeIgnores = strings.TrimSpace(value) == gpu
		return f.write(path, value)
	}
	if err := h.Take(record, []string{nic, gpu}); err == nil {
		t.Fatal("Take passed with a device vfio-pci did not take")
	}
	if err := h.GiveBack(record); err != nil {
		t.Fatal(err)
	}
	if f.driver(nic) != "e1000e" || f.driver(gpu) != "" {
		t.Errorf("after a failed Take and GiveBack: %q %q", f.driver(nic), f.driver(gpu))
	}
}

// TestGiveBackRefusesForgedRecord: a record whose address or driver is
// not one (a path) is refused, not written to sysfs.
func TestGiveBackRefusesForgedRecord(t *testing.T) {
	f := newFake(t, pciDev{"0000:01:00.0", "1", "vfio-pci", ""})
	record := filepath.Join(f.root, "hostdev.json")
	for _, rec := range []string{
		`[{"address":"../../x","driver":"e1000e"}]`,
		`[{"address":"0000:01:00.0","driver":"../../../x"}]`,
		`[{"address":"0000:01:00.0","driver":".."}]`,
	} {
		os.WriteFile(record, []byte(rec), 0o600)
		if err := f.host().GiveBack(record); err == nil {
			t.Errorf("GiveBack of %s passed", rec)
		}
	}
	if len(f.writes) > 0 {
		t.Errorf("wrote %v", f.writes)
	}
}

// TestTakeOneGiveBackOne: a hot-plugged device joins the record of the VM's
// boot-time ones and leaves it alone when given back; GiveBack then gives
// back what is left.
func TestTakeOneGiveBackOne(t *testing.T) {
	const nic, gpu = "0000:01:00.0", "0000:02:00.0"
	f := newFake(t, pciDev{nic, "1", "e1000e", ""}, pciDev{gpu, "2", "snd_hda_intel", ""})
	record := filepath.Join(f.root, "records", "vm", "hostdev.json")
	h := f.host()
	if err := h.Take(record, []string{nic}); err != nil {
		t.Fatal(err)
	}
	if err := h.TakeOne(record, gpu); err != nil {
		t.Fatal(err)
	}
	if f.driver(nic) != DriverVFIO || f.driver(gpu) != DriverVFIO {
		t.Fatalf("after TakeOne: %q %q", f.driver(nic), f.driver(gpu))
	}
	if err := h.GiveBackOne(record, gpu); err != nil {
		t.Fatal(err)
	}
	if f.driver(nic) != DriverVFIO || f.driver(gpu) != "snd_hda_intel" {
		t.Errorf("after GiveBackOne: %q %q", f.driver(nic), f.driver(gpu))
	}
	if err := h.GiveBackOne(record, gpu); err != nil {
		t.Errorf("GiveBackOne again: %v", err)
	}
	if err := h.GiveBack(record); err != nil {
		t.Fatal(err)
	}
	if f.driver(nic) != "e1000e" {
		t.Errorf("after GiveBack: %q", f.driver(nic))
	}
	if err := h.TakeOne(record, gpu); err != nil { // no record yet: made
		t.Fatal(err)
	}
	if err := h.GiveBackOne(record, gpu); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(record); err == nil {
		t.Error("an empty record kept")
	}
}
