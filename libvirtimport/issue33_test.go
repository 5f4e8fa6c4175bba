package libvirtimport

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// convertLoads converts xml, which must import, and loads the VM file.
func convertLoads(t *testing.T, xml string, o Options) (*Result, *spec.VM, string) {
	t.Helper()
	res, err := ConvertWith([]byte(xml), "x.xml", o)
	if err != nil {
		t.Fatal(err)
	}
	f, err := spec.Parse("/import/x.toml", res.TOML)
	if err != nil {
		t.Fatalf("the VM file does not load: %v\n%s", err, res.TOML)
	}
	var lines []string
	for _, d := range res.Dropped {
		lines = append(lines, d.String())
	}
	return res, &f.VM, strings.Join(lines, "\n")
}

// TestManyDisks: 10 000 disks are refused with vmsup's limit, in one line
// naming the file, the element and the limit, not "a vmsup import bug";
// as many disks as the layout has places import.
func TestManyDisks(t *testing.T) {
	domain := func(n int) string {
		var b strings.Builder
		b.WriteString("<domain type='kvm'><name>many</name><memory unit='MiB'>512</memory><devices>")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/var/lib/libvirt/images/d%d.img'/><target dev='vd%d' bus='virtio'/></disk>", i, i)
		}
		b.WriteString("<interface type='bridge'><source bridge='br0'/></interface></devices></domain>")
		return b.String()
	}
	_, err := Convert([]byte(domain(10000)), "many.xml")
	const want = "many.xml: devices/disk: 10000 disks (SATA ones aside), 1 NICs and 0 other PCI devices need 10001 PCI places; vmsup lays out at most 224 (q35 has 232 root ports, 8 of them kept for hotplug)"
	if err == nil || err.Error() != want {
		t.Errorf("err %v\nwant %s", err, want)
	}
	_, vm, lines := convertLoads(t, domain(223), Options{})
	if len(vm.Disks) != 223 || len(vm.NICs) != 1 || lines != "" {
		t.Errorf("%d disks, %d NICs; lines:\n%s", len(vm.Disks), len(vm.NICs), lines)
	}
}

// TestMemoryShapes: DIMMs plugged at start and NUMA cells whose sum is
// the boot memory import with the memory libvirt boots with; huge pages
// and shared memory map to vmsup's.
func TestMemoryShapes(t *testing.T) {
	const disk = "<devices><disk type='file'><source file='/i/r.qcow2'/><target dev='vda'/></disk>"
	for _, c := range []struct {
		name, dom, devs string
		mem, maxMem     spec.Size
		huge            string
		nodes           []spec.Size
		want, not       string
	}{
		{"dimms", "<maxMemory slots='4' unit='GiB'>8</maxMemory><memory unit='MiB'>2048</memory><vcpu>2</vcpu><cpu><numa><cell id='0' cpus='0' memory='512' unit='MiB'/><cell id='1' cpus='1' memory='512' unit='MiB'/></numa></cpu>",
			"<memory model='dimm'><target><size unit='MiB'>1024</size><node>1</node></target></memory>",
			2048 * spec.MiB, 8 * spec.GiB, "", []spec.Size{512 * spec.MiB, 1536 * spec.MiB}, "devices/memory[0]: a 1024 MiB DIMM plugged at start", "maxMemory/@slots"},
		{"dimms-no-numa", "<maxMemory slots='4' unit='GiB'>4</maxMemory><memory unit='MiB'>1536</memory>",
			"<memory model='dimm'><target><size unit='MiB'>512</size></target></memory>",
			1536 * spec.MiB, 4 * spec.GiB, "", nil, "node 0", ""},
		{"hugepages-numa", "<memory unit='GiB'>8</memory><memoryBacking><hugepages><page size='1' unit='GiB'/></hugepages></memoryBacking><vcpu>2</vcpu><cpu><numa><cell cpus='0' memory='1' unit='GiB'/><cell cpus='1' memory='1' unit='GiB'/></numa></cpu>", "",
			2 * spec.GiB, 2 * spec.GiB, "1G", []spec.Size{spec.GiB, spec.GiB}, "memory: 8192 MiB: libvirt boots with the NUMA cells' memory", "memoryBacking"},
		{"odd-hugepages", "<memory unit='MiB'>1025</memory><memoryBacking><hugepages/></memoryBacking>", "",
			1025 * spec.MiB, 1025 * spec.MiB, "", nil, "memoryBacking/hugepages: vmsup would refuse it: memory: 1025M is not a whole number of 2M hugepages", ""},
		{"virtiofs-memfd", "<memory unit='MiB'>1024</memory><memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>",
			"<filesystem type='mount'><driver type='virtiofs'/><source dir='/srv/x'/><target dir='x'/></filesystem>",
			spec.GiB, spec.GiB, "", nil, "", "memoryBacking"},
		{"shared-no-virtiofs", "<memory unit='MiB'>1024</memory><memoryBacking><access mode='shared'/></memoryBacking>", "",
			spec.GiB, spec.GiB, "", nil, "memoryBacking/access: shared: vmsup shares the guest's memory only with a virtiofs share's virtiofsd", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			xml := "<domain type='kvm'><name>m</name>" + c.dom + disk + c.devs + "</devices></domain>"
			_, vm, lines := convertLoads(t, xml, Options{})
			var nodes []spec.Size
			for _, n := range vm.NUMA {
				nodes = append(nodes, n.Memory)
			}
			if vm.Memory != c.mem || vm.MaxMemory != c.maxMem || vm.Hugepages != c.huge || fmt.Sprint(nodes) != fmt.Sprint(c.nodes) {
				t.Errorf("memory %s max %s hugepages %q nodes %v; want %s %s %q %v", vm.Memory, vm.MaxMemory, vm.Hugepages, nodes, c.mem, c.maxMem, c.huge, c.nodes)
			}
			if !strings.Contains(lines, c.want) || (c.not != "" && strings.Contains(lines, c.not)) {
				t.Errorf("lines (want %q, not %q):\n%s", c.want, c.not, lines)
			}
		})
	}
}

// TestCarried: the settings issue 33 found lost reach the VM file, or are
// listed with why (virtiofsd's options, the TPM's PCR banks).
func TestCarried(t *testing.T) {
	xml := `<domain type='kvm'><name>c</name><memory unit='MiB'>1024</memory><vcpu>4</vcpu>
<iothreads>2</iothreads>
<devices>
 <disk type='file'><driver name='qemu' type='raw' iothread='2' queues='4' event_idx='off'/><source file='/i/a.img'/><target dev='vda' bus='virtio'/></disk>
 <interface type='bridge'><source bridge='br0'/><model type='virtio'/><driver txmode='iothread' rx_queue_size='512' tx_queue_size='1024'/><tune><sndbuf>1600</sndbuf></tune></interface>
 <rng model='virtio'><rate bytes='1234' period='2000'/><backend model='random'>/dev/urandom</backend></rng>
 <filesystem type='mount'><source dir='/srv/a'/><target dir='/import/from/host'/></filesystem>
 <filesystem type='mount'><source dir='/srv/b'/><target dir='import_from_host'/></filesystem>
 <filesystem type='mount'><driver type='virtiofs' queue='1024'/><binary path='/usr/libexec/virtiofsd' xattr='on'><cache mode='always'/></binary><source dir='/srv/c'/><target dir='c'/></filesystem>
 <tpm model='tpm-crb'><backend type='emulator' version='2.0'><active_pcr_banks><sha1/><sha256/></active_pcr_banks></backend></tpm>
</devices>
<launchSecurity type='sev'><cbitpos>47</cbitpos><reducedPhysBits>1</reducedPhysBits><policy>0x0003</policy></launchSecurity>
</domain>`
	_, vm, lines := convertLoads(t, xml, Options{NoSEV: "kvm_amd runs with sev = N"})
	d, n := vm.Disks[0], vm.NICs[0]
	if vm.IOThreads != 2 || d.IOThreadID != 2 || d.Queues != 4 || d.EventIdx == nil || *d.EventIdx {
		t.Errorf("iothreads %d, disk %+v", vm.IOThreads, d)
	}
	if n.RxQueueSize != 512 || n.TxQueueSize != 256 || n.SndBuf != 1600 {
		t.Errorf("nic %+v", n)
	}
	if vm.RNGRate.Bytes != 1234 || vm.RNGRate.EffectivePeriod().D().Milliseconds() != 2000 {
		t.Errorf("rng_rate %+v", vm.RNGRate)
	}
	if vm.SEV == nil || vm.SEV.Policy != 3 || vm.SEV.CBitPos != 47 || vm.SEV.ReducedPhysBits != 1 {
		t.Errorf("sev %+v", vm.SEV)
	}
	if len(vm.Shares) != 3 || vm.Shares[0].Tag != "import_from_host" || vm.Shares[1].Tag != "share1" {
		t.Errorf("shares %+v", vm.Shares)
	}
	for _, want := range []string{
		`launchSecurity: carried over as [sev], but this host cannot run SEV guests (kvm_amd runs with sev = N): vmsup refuses to start the VM here`,
		`devices/interface[0]/driver/@tx_queue_size: 1024: QEMU takes at most 256 with a tap backend`,
		`devices/filesystem[0]/target: tag "/import/from/host" is "import_from_host" here`,
		`devices/filesystem[1]/target: tag "import_from_host" is "share1" here`,
		`devices/filesystem[2]/binary: virtiofsd's options`,
		`devices/tpm[0]/backend/active_pcr_banks: swtpm_setup's default PCR banks apply`,
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("not listed: %s\nlines:\n%s", want, lines)
		}
	}
	t.Logf("lines:\n%s", lines)
}

// TestRepair: a value spec refuses (an MTU past 65535) takes its NIC out
// with a line naming the element and the rule, and the rest imports.
func TestRepair(t *testing.T) {
	xml := `<domain type='kvm'><name>r</name><memory unit='MiB'>512</memory><devices>
<disk type='file'><source file='/i/a.img'/><target dev='vda'/></disk>
<interface type='bridge'><source bridge='br0'/><mtu size='70000'/></interface>
<interface type='bridge'><source bridge='br0'/><mtu size='9000'/></interface>
</devices></domain>`
	_, vm, lines := convertLoads(t, xml, Options{})
	if len(vm.NICs) != 1 || vm.NICs[0].MTU != 9000 {
		t.Errorf("nics %+v", vm.NICs)
	}
	if !strings.Contains(lines, "devices/interface[0]: vmsup would refuse it: nic[0].mtu:") {
		t.Errorf("lines:\n%s", lines)
	}
}
