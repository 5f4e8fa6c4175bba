package spec

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

const base = "name = \"web\"\nmemory = \"512M\"\n[boot]\nkernel = \"vmlinux\"\n"

func TestParseDefaults(t *testing.T) {
	f, err := Parse("/etc/vmsup/web.toml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	vm := f.VM
	if vm.Machine != "q35" || vm.Accel != AccelAuto || vm.CPUs != 1 || vm.MaxCPUs != 1 ||
		vm.Memory != 512*MiB || vm.MaxMemory != 512*MiB || vm.Slots() != DefaultHotplugSlots ||
		vm.StopTimeout.D() != DefaultStopTimeout || !vm.HasGuestAgent() || vm.Boot.Firmware != FirmwareBIOS ||
		vm.Limits.MemoryOverhead != DefaultMemoryOverhead || vm.Limits.TasksMax != DefaultTasksMax {
		t.Errorf("defaults not applied: %+v", vm)
	}
	if vm.Boot.Kernel != "/etc/vmsup/vmlinux" {
		t.Errorf("relative kernel path not resolved against the file: %q", vm.Boot.Kernel)
	}
}

func TestParseFull(t *testing.T) {
	f, err := Load("../testdata/example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if f.VM.Disks[0].Format != "qcow2" || f.VM.NICs[0].MAC != DeriveMAC("example", 0) {
		t.Errorf("unexpected: %+v", f.VM)
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]Size{"512M": 512 * MiB, "4G": 4 * GiB, "4GiB": 4 * GiB, "1024k": MiB, "100": 100, "2T": 2 * TiB} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, _ := ParseSize(got.String()); back != got {
			t.Errorf("String round trip of %v failed: %q", got, got.String())
		}
	}
	for _, bad := range []string{"", "M", "-1G", "1.5G", "12Q", "99999999999999T"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func TestDeriveMACStable(t *testing.T) {
	a, b := DeriveMAC("web", 0), DeriveMAC("web", 1)
	if a != DeriveMAC("web", 0) || a == b || !strings.HasPrefix(a, "52:54:00:") {
		t.Errorf("DeriveMAC: %s %s", a, b)
	}
}

// TestBadInput: each broken file gives one *Error whose one-line text names
// the file and the position or field.
func TestBadInput(t *testing.T) {
	cases := []struct{ name, toml, want string }{
		{"unknown key", base + "bogus = 1\n", "web.toml:5:1: boot.bogus: unknown key"},
		{"unknown top key", "name='web'\nmemory='1G'\nmemroy='1G'\n[boot]\nkernel='k'\n", "web.toml:3:1: memroy: unknown key"},
		{"wrong type", "name = 'web'\nmemory = '1G'\ncpus = 'two'\n[boot]\nkernel='k'\n", "web.toml:3:8: cpus:"},
		{"bool size", "name = 'web'\nmemory = true\n[boot]\nkernel='k'\n", "web.toml:2:1: memory: invalid size"},
		{"negative memory", "name = 'web'\nmemory = '-512M'\n[boot]\nkernel='k'\n", "web.toml:2:10: memory: negative size"},
		{"tiny memory", "name = 'web'\nmemory = 512\n[boot]\nkernel='k'\n", "web.toml:2:1: memory: 512 is below the minimum"},
		{"no memory", "name = 'web'\n[boot]\nkernel='k'\n", "web.toml:1:1: memory: missing"},
		{"no name", "memory = '1G'\n[boot]\nkernel='k'\n", "web.toml:1:1: name: missing"},
		{"slash in name", "name = 'a/b'\nmemory = '1G'\n[boot]\nkernel='k'\n", "web.toml:1:1: name: name \"a/b\" may only"},
		{"dotdot name", "name = 'a..b'\nmemory = '1G'\n[boot]\nkernel='k'\n", "name: name \"a..b\" contains \"..\""},
		{"space in name", "name = 'a b'\nmemory = '1G'\n[boot]\nkernel='k'\n", "name: name \"a b\" may only"},
		{"control char in name", "name = \"a\\u0007\"\nmemory = '1G'\n[boot]\nkernel='k'\n", "name: name"},
		{"long name", "name = '" + strings.Repeat("x", 65) + "'\nmemory = '1G'\n[boot]\nkernel='k'\n", "longer than 64"},
		{"unit suffix name", "name = 'x.service'\nmemory = '1G'\n[boot]\nkernel='k'\n", `name: name "x.service" ends in ".service", a systemd unit type: its unit would be vmsup-x.service.service`},
		{"socket suffix name", "name = 'db.Socket'\nmemory = '1G'\n[boot]\nkernel='k'\n", `ends in ".socket", a systemd unit type`},
		{"trailing dot name", "name = 'web.'\nmemory = '1G'\n[boot]\nkernel='k'\n", `name: name "web." ends in "."`},
		{"vmsup's own unit", "name = 'metrics'\nmemory = '1G'\n[boot]\nkernel='k'\n", `web.toml:1:1: name: name "metrics" is reserved: it is the name of vmsup's own unit vmsup-metrics.socket`},
		{"the API's unit", "name = 'api'\nmemory = '1G'\n[boot]\nkernel='k'\n", `web.toml:1:1: name: name "api" is reserved: it is the name of vmsup's own unit vmsup-api.service, the remote API server, not of a VM`},
		{"zero cpus", "name='web'\nmemory='1G'\ncpus=-1\n[boot]\nkernel='k'\n", "web.toml:3:1: cpus: -1 is out of range"},
		{"max_cpus below cpus", "name='web'\nmemory='1G'\ncpus=4\nmax_cpus=2\n[boot]\nkernel='k'\n", "web.toml:4:1: max_cpus:"},
		{"max_memory below memory", "name='web'\nmemory='1G'\nmax_memory='512M'\n[boot]\nkernel='k'\n", "web.toml:3:1: max_memory:"},
		{"bad accel", "name='web'\nmemory='1G'\naccel='xen'\n[boot]\nkernel='k'\n", "web.toml:3:1: accel: unknown accelerator"},
		{"bad machine", "name='web'\nmemory='1G'\nmachine='virt'\n[boot]\nkernel='k'\n", "web.toml:3:1: machine: unknown machine"},
		{"nothing to boot", "name='web'\nmemory='1G'\n", "web.toml:1:1: boot: nothing to boot"},
		{"cmdline without kernel", "name='web'\nmemory='1G'\n[boot]\ncmdline='x'\n[[disk]]\nname='d'\nfile='d.raw'\n", "boot.kernel: initrd and cmdline need a kernel"},
		{"bad firmware", base + "firmware='coreboot'\n", "web.toml:5:1: boot.firmware: unknown firmware"},
		{"disk without file", base + "[[disk]]\nname='d'\n", "web.toml:5:3: disk[0].file: missing image path"},
		{"duplicate disk", base + "[[disk]]\nname='d'\nfile='a'\n[[disk]]\nname='d'\nfile='b'\n", "web.toml:9:1: disk[1].name: duplicate disk name"},
		{"bad cache", base + "[[disk]]\nname='d'\nfile='a'\ncache='fast'\n", "web.toml:8:1: disk[0].cache: unknown cache mode"},
		{"native aio needs direct", base + "[[disk]]\nname='d'\nfile='a'\naio='native'\n", "disk[0].aio: aio \"native\" needs"},
		{"bad format", base + "[[disk]]\nname='d'\nfile='a'\nformat='vmdk'\n", "disk[0].format: unknown format"},
		{"bad mac", base + "[[nic]]\nname='n'\nmac='52:54:00:zz:00:01'\n", "web.toml:7:1: nic[0].mac: invalid MAC"},
		{"multicast mac", base + "[[nic]]\nname='n'\nmac='01:00:5e:00:00:01'\n", "nic[0].mac: MAC address \"01:00:5e:00:00:01\" is multicast"},
		{"duplicate mac", base + "[[nic]]\nname='a'\nmac='52:54:00:00:00:01'\n[[nic]]\nname='b'\nmac='52:54:00:00:00:01'\n", "web.toml:10:1: nic[1].mac: nic \"b\": duplicate MAC"},
		{"bad nic type", base + "[[nic]]\nname='n'\ntype='vde'\n", "nic[0].type: nic \"n\": unknown NIC type"},
		{"bad forward", base + "[[nic]]\nname='n'\nforwards=['tcp:22']\n", "nic[0].forwards[0]: invalid forward"},
		{"bad duration", "name='web'\nmemory='1G'\nstop_timeout='soon'\n[boot]\nkernel='k'\n", "stop_timeout"},
		{"unknown shutdown", "name='web'\nmemory='1G'\nshutdown='pull-the-plug'\n[boot]\nkernel='k'\n", `shutdown: unknown method "pull-the-plug"`},
		{"agent shutdown without agent", "name='web'\nmemory='1G'\nshutdown='agent'\nguest_agent=false\n[boot]\nkernel='k'\n", `shutdown: "agent" needs the guest agent channel`},
		{"syntax error", "name = 'web\nmemory='1G'\n", "web.toml:1:"},
		{"hotplug on pc", "name='web'\nmemory='1G'\nmachine='pc'\nhotplug_slots=4\n[boot]\nkernel='k'\n", "hotplug_slots: root ports exist only on q35"},
		{"tasks too low", base + "[limits]\ntasks_max=3\n", "limits.tasks_max: 3 is too low"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("/etc/vmsup/web.toml", []byte(c.toml))
			if err == nil {
				t.Fatalf("accepted:\n%s", c.toml)
			}
			var se *Error
			if !errors.As(err, &se) {
				t.Errorf("error %T is not *spec.Error: %v", err, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) {
				t.Errorf("error %q does not contain %q", msg, c.want)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
		})
	}
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"0": {0}, "0-3,6": {0, 1, 2, 3, 6}, "3,1-2,1": {1, 2, 3}} {
		got, err := ParseCPUList(in)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "0,,1", "4096"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q) accepted", bad)
		}
	}
}

// TestValidVMName: names a unit can carry as a VM's pass; those ending in
// a unit type or ".", and vmsup's own units' names, are refused for new
// VMs, while ValidName (commands on a VM that exists) still takes them.
func TestValidVMName(t *testing.T) {
	for _, ok := range []string{"web", "web-1", "a_b.c", "my.services", "x.servicex", "metrics2", "apis", "fs-data", "logs", strings.Repeat("x", 64)} {
		if err := ValidVMName(ok); err != nil {
			t.Errorf("ValidVMName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"x.service", "x.socket", "x.target", "x.timer", "x.mount", "x.automount", "x.swap", "x.path",
		"x.slice", "x.scope", "x.device", "X.SERVICE", "web.", "a/b", "", "API", "fleet-guard-ab12-3"} {
		if err := ValidVMName(bad); err == nil {
			t.Errorf("ValidVMName(%q) accepted", bad)
		}
	}
	for _, own := range ReservedNames() {
		if err := ValidVMName(own); err == nil {
			t.Errorf("ValidVMName(%q) accepted vmsup's own unit's name", own)
		}
	}
	if err := ValidName("x.service"); err != nil {
		t.Errorf("ValidName refuses an existing VM's name: %v", err)
	}
}
