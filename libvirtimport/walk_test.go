package libvirtimport

import (
	"strings"
	"testing"
)

// TestUnreadListed: the structural check lists every element and attribute
// the conversion does not read, made-up ones and real ones from libvirt's
// schema alike, each with its value, and nothing it reads.
func TestUnreadListed(t *testing.T) {
	xml := `<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0' frobnicate='yes'>
<name>walk</name><memory unit='MiB' dumpCore='off'>512</memory>
<vcpu placement='static'>2</vcpu>
<iothreads>2</iothreads>
<defaultiothread thread_pool_min='8'/>
<cpu mode='custom' match='exact' check='partial'><model fallback='allow' vendor_id='GenuineIntel'>Haswell</model><cache mode='passthrough'/><numa><cell id='0' cpus='0-1' memory='512' unit='MiB' discard='yes'/></numa></cpu>
<os><type arch='x86_64' machine='q35'>hvm</type><bios useserial='yes' rebootTimeout='0'/></os>
<devices>
 <disk type='file' device='disk' frob='1'>
  <driver name='qemu' type='raw' cache='none' io='native' copy_on_read='on' detect_zeroes='unmap' iothread='1' queues='4' event_idx='off'/>
  <source file='/var/lib/libvirt/images/walk.img'><slices><slice type='storage' offset='0' size='1024'/></slices></source>
  <target dev='vda' bus='virtio' rotation_rate='1'/>
  <geometry cyls='16383' heads='16' secs='63'/>
 </disk>
 <interface type='bridge'>
  <source bridge='br0'/><model type='virtio'/>
  <driver name='vhost' queues='2' rx_queue_size='512' tx_queue_size='256' rss='on'/>
  <coalesce><rx><frames max='7'/></rx></coalesce>
  <tune><sndbuf>1600</sndbuf></tune>
  <rom bar='off' tftp='x'/>
 </interface>
 <interface type='network'><source network='default' portgroup='web'/><model type='virtio'/></interface>
 <console type='pty'><target type='virtio' port='0'/></console>
 <memballoon model='virtio'><stats period='10'/></memballoon>
 <frobnicator level='11'/>
</devices>
<launchSecurity type='sev'><cbitpos>47</cbitpos><reducedPhysBits>1</reducedPhysBits><policy>0x0003</policy><session>AAAA</session></launchSecurity>
</domain>`
	res, err := Convert([]byte(xml), "walk.xml")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range res.Dropped {
		got = append(got, d.String())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		`@frobnicate: "yes": vmsup import does not read this attribute`,          // made up, on the root
		`memory/@dumpCore: "off": vmsup import does not read this attribute`,     // libvirt's
		`defaultiothread: vmsup import does not read this element`,               // libvirt's
		`cpu/model/@vendor_id: "GenuineIntel"`,                                   // libvirt's
		`cpu/cache: vmsup import does not read this element`,                     // libvirt's
		`os/bios: vmsup import does not read this element`,                       // libvirt's
		`devices/disk[0]/@frob: "1"`,                                             // made up
		`devices/disk[0]/driver/@copy_on_read: "on"`,                             // libvirt's
		`devices/disk[0]/driver/@detect_zeroes: "unmap"`,                         // libvirt's
		`devices/disk[0]/source/slices: vmsup import does not read this element`, // libvirt's
		`devices/disk[0]/target/@rotation_rate: "1"`,                             // libvirt's
		`devices/disk[0]/geometry: vmsup import does not read this element`,      // libvirt's
		`devices/interface[0]/driver/@rss: "on"`,                                 // libvirt's
		`devices/interface[0]/coalesce: vmsup import does not read this element`, // libvirt's
		`devices/interface[0]/rom/@tftp: "x": vmsup import does not read`,        // made up
		`cpu/numa/cell/@discard: "yes"`,                                          // libvirt's
		`devices/interface[1]/source/@portgroup: "web"`,                          // libvirt's
		`devices/console[0]: a virtio console`,                                   // read, not carried: a line
		`devices/memballoon[0]/stats: vmsup import does not read this element`,   // libvirt's
		`devices/frobnicator[0]: vmsup import does not read this element`,        // made up
		`launchSecurity/session: vmsup import does not read this element`,        // libvirtxml misspells it
	} {
		if !strings.Contains(all, want) {
			t.Errorf("not listed: %s", want)
		}
	}
	for _, read := range []string{"@type", "vcpu/@placement", "driver/@queues", "driver/@event_idx", "driver/@iothread",
		"driver/@rx_queue_size", "tune/sndbuf", "cpu/@match", "model/@fallback", "launchSecurity/cbitpos", "xmlns"} {
		for _, d := range got {
			if strings.Contains(d, read+":") || strings.Contains(d, read+" ") {
				t.Errorf("%s is read, yet listed: %s", read, d)
			}
		}
	}
	t.Logf("listed:\n%s", all)
}
