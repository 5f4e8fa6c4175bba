package qemuargs

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/spec"
)

// TestHostDevOneValue: the vfio-pci device device_add would send for a
// hot-plug is the -device value Build puts on the command line for the
// same device on the same port (the host side cannot be live here: no
// IOMMU, so this compares the renderings, and the goldens pin the argv).
func TestHostDevOneValue(t *testing.T) {
	f, err := spec.Parse("/golden/hd.toml", []byte(`name = "hd"
accel = "tcg"
memory = "256M"
hotplug_slots = 1
[boot]
kernel = "vmlinux"
[[hostdev]]
address = "01:00.0"
rom_bar = false
`))
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Binary: "/usr/bin/qemu-system-x86_64", Accel: spec.AccelTCG, QMPSocket: "/run/q.sock",
		EventSocket: "/run/e.sock", ConsoleSocket: "/run/c.sock", AgentSocket: "/run/a.sock"}
	argv, err := Build(&f.VM, o)
	if err != nil {
		t.Fatal(err)
	}
	var boot map[string]any
	for i, a := range argv {
		if a == "-device" && strings.Contains(argv[i+1], `"vfio-pci"`) {
			if err := json.Unmarshal([]byte(argv[i+1]), &boot); err != nil {
				t.Fatal(err)
			}
		}
	}
	if boot == nil {
		t.Fatalf("no vfio-pci device in %q", argv)
	}
	dev, err := HostDevDevice(f.VM.HostDevs[0], boot["bus"].(string))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(dev) // device_add's arguments (qmp.Conn.DeviceAdd marshals the Device)
	if err != nil {
		t.Fatal(err)
	}
	var hot map[string]any
	if err := json.Unmarshal(raw, &hot); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(boot, hot); diff != "" {
		t.Errorf("boot -device vs device_add (-boot +hotplug):\n%s", diff)
	}
	want := map[string]any{"driver": "vfio-pci", "id": "hostdev-pci-0000-01-00.0", "bus": "rp1", "host": "0000:01:00.0", "rombar": float64(0)}
	if diff := cmp.Diff(want, hot); diff != "" {
		t.Errorf("device_add arguments (-want +got):\n%s", diff)
	}
}

func TestHostDevDeviceErrors(t *testing.T) {
	for _, c := range []struct {
		h    spec.HostDev
		want string
	}{
		{spec.HostDev{Name: "x", Address: "1:0.0"}, `hostdev "x": address: "1:0.0" is not a PCI address`},
		{spec.HostDev{Name: "x", Address: "01:00.0"}, `hostdev "x": address: "01:00.0" is not in its full form "0000:01:00.0"`},
		{spec.HostDev{Name: "x", Address: "0000:01:20.0"}, `slot 20 is beyond 1f`},
		{spec.HostDev{Name: "a,b", Address: "0000:01:00.0"}, `hostdev "a,b": name: name "a,b" may only contain`},
	} {
		_, err := HostDevDevice(c.h, "rp1")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("HostDevDevice(%+v): %v, want %q", c.h, err, c.want)
		}
	}
}
