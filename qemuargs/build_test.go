package qemuargs

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/spec"
)

func TestEscapeValue(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "/run/vmsup/web/qmp.sock", want: "/run/vmsup/web/qmp.sock"},
		{in: "/tmp/a,b/qmp.sock", want: "/tmp/a,,b/qmp.sock"},
		{in: ",,", want: ",,,,"},
		{in: "a=b c'\"", want: "a=b c'\""},
		{in: "", want: ""},
		{in: "/tmp/a\nb", err: "newline"},
		{in: "/tmp/a\rb", err: "newline"},
		{in: "/tmp/a\x00b", err: "NUL"},
		{in: "/tmp/\xff", err: "UTF-8"},
	} {
		got, err := escapeValue(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("escapeValue(%q) error = %v, want one containing %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("escapeValue(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	// The real-QEMU half of this test is TestGoldenArgsStartInQEMU: its socket
	// paths live in a directory whose name has a comma.
}

func TestNodeNames(t *testing.T) {
	names := []string{"a", "root", "0", "root.v2-a_b", strings.Repeat("x", 25), strings.Repeat("x", 26),
		strings.Repeat("x", 64), strings.Repeat("x", 63) + "y", strings.Repeat("x", 17) + "-12345678"}
	seen := map[string]string{}
	for _, n := range names {
		for _, id := range []string{DiskNodeName(n), DiskFileNodeName(n)} {
			if len(id) > maxNodeName {
				t.Errorf("node name %q for disk %q is longer than %d bytes", id, n, maxNodeName)
			}
			if other, dup := seen[id]; dup {
				t.Errorf("node name %q for disk %q and %q", id, n, other)
			}
			seen[id] = n
		}
	}
	if got := DiskNodeName("root"); got != "fmt-root" {
		t.Errorf("DiskNodeName(root) = %q", got)
	}
	if got, want := []string{DiskDeviceID("d"), NICDeviceID("n"), NetdevID("n"), RootPortID(3)},
		[]string{"disk-d", "nic-n", "net-n", "rp3"}; !cmp.Equal(got, want) {
		t.Errorf("ids = %q, want %q", got, want)
	}
}

// validVM is a filled-in VM as spec.Parse returns it.
func validVM(t *testing.T, toml string) *spec.VM {
	t.Helper()
	f, err := spec.Parse("/golden/t.toml", []byte("name = \"t\"\naccel = \"tcg\"\nmemory = \"256M\"\n"+toml))
	if err != nil {
		t.Fatal(err)
	}
	return &f.VM
}

var testOptions = Options{Binary: "/usr/bin/qemu-system-x86_64", Accel: spec.AccelTCG,
	QMPSocket: "/run/t/qmp", EventSocket: "/run/t/ev", ConsoleSocket: "/run/t/con", AgentSocket: "/run/t/qga"}

// TestBuildErrors covers VMs that spec.Parse would refuse or never produce:
// Build must still fail, naming the VM and the field.
func TestBuildErrors(t *testing.T) {
	const disk = "[[disk]]\nname = \"root\"\nfile = \"root.img\"\n"
	for _, tc := range []struct {
		name   string
		toml   string
		edit   func(*spec.VM)
		field  string
		substr string
	}{
		{"empty machine", disk, func(vm *spec.VM) { vm.Machine = "" }, "machine", "unknown machine"},
		{"zero cpus", disk, func(vm *spec.VM) { vm.CPUs = 0 }, "cpus", "out of range"},
		{"max below cpus", disk, func(vm *spec.VM) { vm.MaxCPUs = 0 }, "max_cpus", "between"},
		{"no memory", disk, func(vm *spec.VM) { vm.Memory = 0 }, "memory", "positive"},
		{"odd memory", disk, func(vm *spec.VM) { vm.Memory = 300 * spec.KiB }, "memory", "MiB"},
		{"max memory unset", disk, func(vm *spec.VM) { vm.MaxMemory = 0 }, "max_memory", "at least"},
		{"bad name", disk, func(vm *spec.VM) { vm.Name = "a,b" }, "name", "may only contain"},
		{"cpu model comma", disk, func(vm *spec.VM) { vm.CPUModel = "max,+vmx" }, "cpu_model", "invalid"},
		{"firmware empty", disk, func(vm *spec.VM) { vm.Boot.Firmware = "" }, "boot.firmware", "unknown"},
		{"relative kernel", "[boot]\nkernel = \"k\"\n", func(vm *spec.VM) { vm.Boot.Kernel = "k" }, "boot.kernel", "absolute"},
		{"cmdline newline", "[boot]\nkernel = \"k\"\n", func(vm *spec.VM) { vm.Boot.Cmdline = "a\nb" }, "boot.cmdline", "newline"},
		{"initrd without kernel", disk, func(vm *spec.VM) { vm.Boot.Initrd = "/i" }, "boot.kernel", "need a kernel"},
		{"disk relative", disk, func(vm *spec.VM) { vm.Disks[0].File = "x.img" }, "disk[0].file", "absolute"},
		{"disk non-UTF-8", disk, func(vm *spec.VM) { vm.Disks[0].File = "/x\xff.img" }, "disk[0].file", "UTF-8"},
		{"disk format", disk, func(vm *spec.VM) { vm.Disks[0].Format = "vmdk" }, "disk[0].format", "unknown format"},
		{"disk cache", disk, func(vm *spec.VM) { vm.Disks[0].Cache = "" }, "disk[0].cache", "unknown cache"},
		{"disk aio", disk, func(vm *spec.VM) { vm.Disks[0].AIO = "" }, "disk[0].aio", "unknown aio"},
		{"disk native", disk, func(vm *spec.VM) { vm.Disks[0].AIO = "native" }, "disk[0].aio", "needs cache"},
		{"disk serial", disk, func(vm *spec.VM) { vm.Disks[0].Serial = strings.Repeat("s", 21) }, "disk[0].serial", "20 bytes"},
		{"disk boot index", disk, func(vm *spec.VM) { vm.Disks[0].BootIndex = -1 }, "disk[0].boot_index", "negative"},
		{"disk duplicate", disk + "[[disk]]\nname = \"b\"\nfile = \"b.img\"\n",
			func(vm *spec.VM) { vm.Disks[1].Name = "root" }, "disk[1].name", "duplicate disk name"},
		{"nic type", disk + "[[nic]]\nname = \"n\"\n", func(vm *spec.VM) { vm.NICs[0].Type = "tap" }, "nic[0].type", "unknown NIC type"},
		{"nic mac", disk + "[[nic]]\nname = \"n\"\n", func(vm *spec.VM) { vm.NICs[0].MAC = "" }, "nic[0].mac", "invalid MAC"},
		{"nic multicast", disk + "[[nic]]\nname = \"n\"\n", func(vm *spec.VM) { vm.NICs[0].MAC = "01:00:00:00:00:01" }, "nic[0].mac", "multicast"},
		{"nic forward", disk + "[[nic]]\nname = \"n\"\n", func(vm *spec.VM) { vm.NICs[0].Forwards = []string{"tcp:1-2,x=y"} }, "nic[0].forwards[0]", "invalid forward"},
		{"nic duplicate mac", disk + "[[nic]]\nname = \"n\"\n[[nic]]\nname = \"m\"\n",
			func(vm *spec.VM) { vm.NICs[1].MAC = strings.ToUpper(vm.NICs[0].MAC) }, "nic[1].mac", "duplicate MAC"},
		{"nic duplicate name", disk + "[[nic]]\nname = \"n\"\n[[nic]]\nname = \"m\"\n",
			func(vm *spec.VM) { vm.NICs[1].Name = "n" }, "nic[1].name", "duplicate NIC"},
		{"slots negative", disk, func(vm *spec.VM) { n := -1; vm.HotplugSlots = &n }, "hotplug_slots", "negative"},
		{"slots on pc", disk, func(vm *spec.VM) { vm.Machine = "pc" }, "hotplug_slots", "only on q35"},
		{"too many root ports", disk, func(vm *spec.VM) {
			n := 0
			vm.HotplugSlots = &n
			for i := 1; i < 233; i++ {
				d := vm.Disks[0]
				d.Name = fmt.Sprintf("d%d", i)
				vm.Disks = append(vm.Disks, d)
			}
		}, "disk[232]", "needs root port 233 of at most 232"},
		{"too many root ports for slots", disk, func(vm *spec.VM) {
			n := 232
			vm.HotplugSlots = &n
		}, "hotplug_slots", "needs root port 233"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := validVM(t, tc.toml)
			tc.edit(vm)
			argv, err := Build(vm, testOptions)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Build = %q, %v; want *Error", argv, err)
			}
			if e.VM != vm.Name || e.Field != tc.field || !strings.Contains(e.Msg, tc.substr) || e.Object != "" {
				t.Errorf("Build error %#v (%q), want vm %q field %q message containing %q", e, e, vm.Name, tc.field, tc.substr)
			}
		})
	}
}

func TestBuildNilAndHelpersErrors(t *testing.T) {
	if _, err := Build(nil, testOptions); err == nil {
		t.Error("Build(nil) succeeded")
	}
	_, err := Disk(spec.Disk{Name: "data", Type: "file", File: "/d.img", Format: "raw", Cache: "fast", AIO: "threads"}, DiskHost{}, "rp1")
	if got, want := fmt.Sprint(err), `disk "data": cache: unknown cache mode "fast"`; got != want {
		t.Errorf("Disk error = %q, want %q", got, want)
	}
	_, err = Disk(spec.Disk{Name: "s", Type: "iscsi", Portal: "127.0.0.1:3260", Target: "iqn.2026-01.t:x", User: "u",
		SecretFile: "/etc/chap", Format: "raw", Cache: "writeback", AIO: "threads"}, DiskHost{}, "rp1")
	if got, want := fmt.Sprint(err), `disk "s": Options.Disks.SecretFile: missing path`; got != want {
		t.Errorf("Disk error = %q, want %q", got, want)
	}
	_, err = NICNetdev(spec.NIC{Name: "lan", Type: "tap", MAC: "52:54:00:00:00:01"}, false)
	if got, want := fmt.Sprint(err), `nic "lan": type: unknown NIC type "tap" (want "user", "bridge", "ovs", "cni" or "network")`; got != want {
		t.Errorf("NICNetdev error = %q, want %q", got, want)
	}
}

// TestBuildOptionsIgnored: firmware options are ignored where the firmware
// does not use them, and the agent socket without an agent.
func TestBuildOptionsIgnored(t *testing.T) {
	vm := validVM(t, "guest_agent = false\n[[disk]]\nname = \"root\"\nfile = \"root.img\"\n")
	o := testOptions
	o.AgentSocket, o.FirmwareCode, o.FirmwareVars = "", "/nonsense", "relative"
	argv, err := Build(vm, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range argv {
		if strings.Contains(a, "nonsense") || strings.Contains(a, "relative") || strings.Contains(a, "guest-agent") {
			t.Errorf("argv has %q", a)
		}
	}
}

// TestBuildTaps: Options.Taps gives a NIC another tap to open (a local
// migration's new QEMU) and leaves the others on their own.
func TestBuildTaps(t *testing.T) {
	vm := validVM(t, "[[disk]]\nname = \"root\"\nfile = \"root.img\"\n"+
		"[[nic]]\nname = \"a\"\ntype = \"bridge\"\nbridge = \"br0\"\ntap = \"tapa\"\n"+
		"[[nic]]\nname = \"b\"\ntype = \"bridge\"\nbridge = \"br0\"\ntap = \"tapb\"\n")
	o := testOptions
	o.Taps = map[string]string{"a": "vmmnext"}
	argv, err := Build(vm, o)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(argv, " ")
	for _, want := range []string{`"ifname":"vmmnext"`, `"ifname":"tapb"`} {
		if !strings.Contains(line, want) {
			t.Errorf("argv lacks %s: %s", want, line)
		}
	}
	if strings.Contains(line, `"ifname":"tapa"`) || vm.NICs[0].Tap != "tapa" {
		t.Errorf("NIC a still opens its own tap, or its spec changed (%q): %s", vm.NICs[0].Tap, line)
	}
}

func TestSpareRootPorts(t *testing.T) {
	vm := validVM(t, "hotplug_slots = 3\n[[disk]]\nname = \"root\"\nfile = \"root.img\"\n[[nic]]\nname = \"n\"\n")
	if got, want := SpareRootPorts(vm), []string{"rp3", "rp4", "rp5"}; !cmp.Equal(got, want) {
		t.Errorf("SpareRootPorts = %q, want %q", got, want)
	}
}

// TestBlockDeviceFromFDSet: a block device vmsup opened and passed to QEMU
// is opened as /dev/fdset/N; without a passed descriptor, by its path.
func TestBlockDeviceFromFDSet(t *testing.T) {
	d, err := spec.CheckDisk("t.toml", spec.Disk{Name: "lv", Type: spec.DiskBlock, File: "/dev/vg0/lv", Format: "raw"}, "vm")
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{"/dev/fdset/3": `"filename":"/dev/fdset/3"`, "": `"filename":"/dev/vg0/lv"`} {
		p, err := Disk(*d, DiskHost{Image: host}, "rp0")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(p.Blockdevs)
		if !strings.Contains(string(b), want) || !strings.Contains(string(b), `"driver":"host_device"`) {
			t.Fatalf("host %q: blockdevs %s, want %s", host, b, want)
		}
	}
}
