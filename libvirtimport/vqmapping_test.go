package libvirtimport

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestIOThreadVQMapping: a disk's queues mapped over several I/O threads
// are carried as iothread_map where this host's QEMU has
// iothread-vq-mapping (9.0+), and listed as not carried (the disk in its
// first thread) where it has not.
func TestIOThreadVQMapping(t *testing.T) {
	xml := `<domain type='kvm'><name>q</name><memory unit='MiB'>1024</memory><vcpu>4</vcpu>
<iothreads>2</iothreads>
<devices>
 <disk type='file'><driver name='qemu' type='raw' queues='4'><iothreads><iothread id='1'><queue id='0'/><queue id='2'/></iothread><iothread id='2'><queue id='1'/><queue id='3'/></iothread></iothreads></driver><source file='/i/a.img'/><target dev='vda' bus='virtio'/></disk>
 <disk type='file'><driver name='qemu' type='raw'><iothreads><iothread id='2'/><iothread id='1'/></iothreads></driver><source file='/i/b.img'/><target dev='vdb' bus='virtio'/></disk>
</devices></domain>`
	_, vm, lines := convertLoads(t, xml, Options{IOThreadVQMapping: true})
	want := []spec.IOThreadQueues{{Thread: 1, Queues: []int{0, 2}}, {Thread: 2, Queues: []int{1, 3}}}
	if d := vm.Disks[0]; !reflect.DeepEqual(d.IOThreadMap, want) || d.IOThreadID != 0 || d.Queues != 4 {
		t.Errorf("QEMU 9+: disk 0 %+v, want iothread_map %+v", d, want)
	}
	if d := vm.Disks[1]; !reflect.DeepEqual(d.IOThreadMap, []spec.IOThreadQueues{{Thread: 2}, {Thread: 1}}) {
		t.Errorf("QEMU 9+: disk 1 iothread_map %+v", d.IOThreadMap)
	}
	if strings.Contains(lines, "iothreads") {
		t.Errorf("QEMU 9+: the mapping was listed as not carried:\n%s", lines)
	}

	_, vm, lines = convertLoads(t, xml, Options{})
	if d := vm.Disks[0]; len(d.IOThreadMap) != 0 || d.IOThreadID != 1 {
		t.Errorf("QEMU 7.2: disk 0 %+v, want its first thread and no map", d)
	}
	if !strings.Contains(lines, "devices/disk[0]/driver/iothreads") || !strings.Contains(lines, "need QEMU 9") {
		t.Errorf("QEMU 7.2: the mapping is not listed as not carried:\n%s", lines)
	}
}
