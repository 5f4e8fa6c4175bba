package caps

import (
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// qemu72 is a record of QEMU 7.2's machines (part of them) and devices.
func qemu72() *Caps {
	return &Caps{QEMU: QEMU{Version: "7.2.19",
		Machines: []string{"pc", "pc-i440fx-6.2", "pc-i440fx-7.2", "pc-q35-6.2", "pc-q35-7.1", "pc-q35-7.2", "q35"},
		Aliases:  map[string]string{"q35": "pc-q35-7.2", "pc": "pc-i440fx-7.2"},
		Devices:  []string{"VGA", "bochs-display", "virtio-net-pci", "virtio-vga"},
	}}
}

func TestMachineType(t *testing.T) {
	c := qemu72()
	for name, want := range map[string]string{"q35": "pc-q35-7.2", "pc": "pc-i440fx-7.2", "pc-q35-6.2": "pc-q35-6.2"} {
		if got, err := c.MachineType(name); got != want || err != nil {
			t.Errorf("MachineType(%s) = %q, %v; want %s", name, got, err, want)
		}
	}
	_, err := c.MachineType("pc-q35-10.0")
	if err == nil || err.Error() != `QEMU 7.2.19 has no machine type "pc-q35-10.0" (it offers pc-q35-7.2, pc-q35-7.1, pc-q35-6.2, ...)` {
		t.Errorf("pc-q35-10.0 on 7.2: %v", err)
	}
	if v := (&Caps{}).MachineVersions("q35"); v != nil {
		t.Errorf("no list: %v", v)
	}
	if got, err := (&Caps{}).MachineType("q35"); got != "q35" || err != nil {
		t.Errorf("a record without machines takes the name: %q %v", got, err)
	}
	c.QEMU.Machines = append(c.QEMU.Machines, "pc-q35-10.0")
	if v := c.MachineVersions("q35"); v[0] != "pc-q35-10.0" || v[1] != "pc-q35-7.2" {
		t.Errorf("newest first: %v", v)
	}
}

// TestCheckDevice: a video device this QEMU lacks (qxl, packaged apart in
// Debian's QEMU 10) is refused with one line naming the field; Resolve
// gives the versioned machine type.
func TestCheckDevice(t *testing.T) {
	c := qemu72()
	c.KVM.Kind = KVMNone
	f, err := spec.Parse("/v/x.toml", []byte("name = \"x\"\nmemory = \"256M\"\naccel = \"tcg\"\nboot.kernel = \"/k\"\n[display]\nvideo = \"qxl\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.CheckDevice(f, "display.video", "qxl", "qxl-vga")
	want := `display.video: "qxl" needs QEMU's qxl-vga device, which QEMU 7.2.19 here does not offer`
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("qxl: %v", err)
	}
	if err := c.CheckDevice(f, "display.video", "std", "VGA"); err != nil {
		t.Fatal(err)
	}
	r, err := c.Resolve(f)
	if err != nil || r.Machine != "pc-q35-7.2" {
		t.Fatalf("std: %+v %v", r, err)
	}
}

// TestCPRTransfer: QEMU 10's record offers cpr-transfer; 7.2's (no
// migration modes at all) says why not, naming its version.
func TestCPRTransfer(t *testing.T) {
	if ok, why := qemu72().CPRTransfer(); ok || why != "QEMU 7.2.19 has no cpr-transfer migration mode (QEMU 10.0 and newer have it)" {
		t.Errorf("7.2: %v %q", ok, why)
	}
	c := &Caps{QEMU: QEMU{Version: "10.0.2", MigrationModes: []string{"normal", "cpr-reboot", "cpr-transfer"}}}
	if ok, why := c.CPRTransfer(); !ok || why != "" {
		t.Errorf("10.0: %v %q", ok, why)
	}
}
