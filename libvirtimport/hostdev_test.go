package libvirtimport

import (
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestHostDevs: PCI hostdevs (VFIO) become [[hostdev]], the rest is listed
// as not carried over. No stored dump has one (they come from virt-install
// on a host without an IOMMU), hence inline XML.
func TestHostDevs(t *testing.T) {
	xml := `<domain type='kvm'><name>pt</name><memory unit='MiB'>512</memory>
<os><type arch='x86_64' machine='q35'>hvm</type><kernel>/boot/vmlinuz</kernel></os>
<devices>
 <hostdev mode='subsystem' type='pci' managed='yes'><driver name='vfio'/>
  <source><address domain='0x0000' bus='0x01' slot='0x00' function='0x0'/></source></hostdev>
 <hostdev mode='subsystem' type='pci' managed='no'>
  <source><address domain='0x0000' bus='0x0a' slot='0x1f' function='0x7'/></source><rom bar='off'/><boot order='2'/></hostdev>
 <hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/><product id='0xbeef'/></source></hostdev>
</devices></domain>`
	res, err := Convert([]byte(xml), "pt.xml")
	if err != nil {
		t.Fatal(err)
	}
	f, err := spec.Parse("/import/pt.toml", res.TOML)
	if err != nil {
		t.Fatalf("the VM file does not load: %v\n%s", err, res.TOML)
	}
	h := f.VM.HostDevs
	if len(h) != 2 || h[0].Address != "0000:01:00.0" || h[0].ROMBar != nil || h[1].Address != "0000:0a:1f.7" || h[1].ROMBar == nil || *h[1].ROMBar {
		t.Errorf("hostdevs: %+v\n%s", h, res.TOML)
	}
	for _, want := range []string{"devices/hostdev[1]/@managed", "devices/hostdev[1]/boot", "devices/hostdev[2]: only PCI devices"} {
		if !strings.Contains(string(res.TOML), want) {
			t.Errorf("no %q among what was not carried over:\n%s", want, res.TOML)
		}
	}
}
