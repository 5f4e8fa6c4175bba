package plan

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

const base = `name = "web"
memory = "256M"
max_memory = "512M"
cpus = 1
max_cpus = 2
[boot]
kernel = "/k"
cmdline = "console=ttyS0"
[[disk]]
name = "root"
file = "/img/root.qcow2"
[[disk]]
name = "cd"
type = "iso"
file = "/img/a.iso"
[[nic]]
name = "lan"
`

func parse(t *testing.T, toml string) *spec.VM {
	t.Helper()
	f, err := spec.Parse("/etc/vmsup/web.toml", []byte(toml))
	if err != nil {
		t.Fatal(err)
	}
	return &f.VM
}

func edit(old, new string) string { return strings.Replace(base, old, new, 1) }

func TestDiffClasses(t *testing.T) {
	run := parse(t, base)
	facts := Facts{SpareSlots: 1, BootMemory: 256 * spec.MiB}
	for _, c := range []struct {
		name, toml string
		want       []string // Change.String() prefixes, in order
	}{
		{"same", base, nil},
		{"description", base + "\n", nil},
		{"cpus up", edit("cpus = 1", "cpus = 2"), []string{"live       cpus: 1 -> 2 (device_add of vCPUs); guest: online"}},
		{"cpus past max", edit("cpus = 1\nmax_cpus = 2", "cpus = 3\nmax_cpus = 3"),
			[]string{"restart    cpus: 1 -> 3; not live: above the max_cpus (2)", "restart    max_cpus: 2 -> 3; not live: vCPU hotplug"}},
		{"cpus down", edit("memory = \"256M\"", "memory = \"256M\"\n") + "", nil},
		{"memory up", edit(`memory = "256M"`, `memory = "384M"`), []string{"live       memory: 256M -> 384M (device_add of a pc-dimm)"}},
		{"memory below boot", edit(`memory = "256M"`, `memory = "128M"`), []string{"restart    memory: 256M -> 128M; not live: below the 256M"}},
		{"cmdline", edit(`cmdline = "console=ttyS0"`, `cmdline = "console=ttyS0 quiet"`), []string{`reboot     boot.cmdline: "console=ttyS0" -> "console=ttyS0 quiet"; not live: the firmware`}},
		{"machine", edit(`name = "web"`, "name = \"web\"\nmachine = \"pc\"\nhotplug_slots = 0"), []string{
			`restart    machine: "q35" -> "pc"; not live: the machine type is fixed when QEMU starts; warning: the guest sees another chipset`,
			"restart    hotplug_slots: 8 -> 0"}},
		{"iops", edit(`file = "/img/root.qcow2"`, "file = \"/img/root.qcow2\"\niops = 50"), []string{"live       disk[root].io-limits: unlimited -> iops=50 (block_set_io_throttle)"}},
		{"medium", edit(`file = "/img/a.iso"`, `file = "/img/b.iso"`), []string{`live       disk[cd].file: /img/a.iso -> /img/b.iso (blockdev-open-tray`}},
		{"cache", edit(`file = "/img/root.qcow2"`, "file = \"/img/root.qcow2\"\ncache = \"none\""), []string{`restart    disk[root].cache: "writeback" -> "none"; not live: QEMU fixes it when it opens the disk`}},
		{"format", edit(`file = "/img/root.qcow2"`, "file = \"/img/root.qcow2\"\nformat = \"raw\""), []string{`impossible disk[root].format: qcow2 -> raw; not live: the image /img/root.qcow2 is qcow2`}},
		{"grow", edit(`file = "/img/root.qcow2"`, "file = \"/img/root.qcow2\"\nsize = \"1G\""), []string{"live       disk[root].size: 0 -> 1G (block_resize)"}},
		{"link", edit(`name = "lan"`, "name = \"lan\"\nlink = \"down\""), []string{"live       nic[lan].link: up -> down (set_link)"}},
		{"mac", edit(`name = "lan"`, "name = \"lan\"\nmac = \"52:54:00:00:00:99\""), []string{"restart    nic[lan].mac"}},
		{"limits", edit(`name = "web"`, "name = \"web\"\n[limits]\ncpu_quota = 50\n"), nil},
		{"add two disks, one slot", base + "[[disk]]\nname = \"d1\"\nfile = \"/img/d1.qcow2\"\n[[disk]]\nname = \"d2\"\nfile = \"/img/d2.qcow2\"\n",
			[]string{"live       disk[d1]: (none) -> file /img/d1.qcow2 (blockdev-add, device_add)", "restart    disk[d2]: (none) -> file /img/d2.qcow2; not live: no free hotplug slot"}},
		{"remove nic", strings.Replace(base, "[[nic]]\nname = \"lan\"\n", "", 1), []string{"live       nic[lan]: user -> (none) (device_del, netdev_del)"}},
		{"health", base + "[health]\nconsole = \"READY\"\n", []string{`live       health.console: (none) -> "READY" (record (read by the next restart))`}},
		{"balloon without a balloon", edit(`name = "web"`, "name = \"web\"\nballoon = true\nballoon_target = \"128M\""), []string{
			"restart    balloon: false -> true; not live: the balloon is a device", "restart    balloon_target: 0 -> 128M; not live: the VM runs without a balloon device"}},
	} {
		if c.name == "limits" {
			// [limits] after [[nic]] would belong to the nic: put it first.
			c.toml = strings.Replace(base, "[boot]", "[limits]\ncpu_quota = 50\n[boot]", 1)
			c.want = []string{"live       limits.cpu_quota: 0 -> 50 (unit property CPUQuotaPerSecUSec)"}
		}
		got := Diff(run, parse(t, c.toml), facts)
		if len(got) != len(c.want) {
			t.Errorf("%s: got %d changes, want %d:\n%s", c.name, len(got), len(c.want), lines(got))
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(got[i].String(), w) {
				t.Errorf("%s: change %d:\n got  %s\n want %s...", c.name, i, got[i], w)
			}
		}
	}
}

func TestDiffOrderAndBlocking(t *testing.T) {
	run := parse(t, base)
	want := parse(t, strings.Replace(edit(`file = "/img/root.qcow2"`, "file = \"/img/root.qcow2\"\nformat = \"raw\""),
		"[[nic]]\nname = \"lan\"\n", "[[nic]]\nname = \"wan\"\n", 1))
	got := Diff(run, want, Facts{SpareSlots: 4, BootMemory: run.Memory})
	if len(got) < 3 || got[0].Kind != NICRemove || got[1].Kind != NICAdd {
		t.Fatalf("removals, then additions first:\n%s", lines(got))
	}
	if b := Blocking(got); len(b) != 1 || b[0].Field != "disk[root].format" {
		t.Errorf("blocking: %v", b)
	}
}

func TestDiffKeptByHand(t *testing.T) {
	run := parse(t, base)
	want := parse(t, base+"[[disk]]\nname = \"scratch\"\nfile = \"/img/s.qcow2\"\n")
	got := Diff(run, want, Facts{SpareSlots: 4, BootMemory: run.Memory, KeptDisks: []string{"scratch"}})
	if len(got) != 1 || got[0].Class != Impossible {
		t.Errorf("a disk attached by hand with another definition: %v", lines(got))
	}
}

func lines(cs []Change) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString("  " + c.String() + "\n")
	}
	return b.String()
}

func TestDiffBalloonLive(t *testing.T) {
	run := parse(t, edit(`name = "web"`, "name = \"web\"\nballoon = true"))
	want := parse(t, edit(`name = "web"`, "name = \"web\"\nballoon = true\nballoon_target = \"192M\""))
	got := Diff(run, want, Facts{BootMemory: run.Memory})
	if len(got) != 1 || got[0].Class != Live || got[0].Kind != Balloon {
		t.Errorf("balloon target on a VM with a balloon:\n%s", lines(got))
	}
}

// TestDiffNotLive: a new disk the running VM could not open (the
// supervisor's hot-plug check said why) is a restart, with that reason, and
// takes no hotplug slot.
func TestDiffNotLive(t *testing.T) {
	run := parse(t, base)
	want := parse(t, base+"[[disk]]\nname = \"far\"\nfile = \"/home/u/far.qcow2\"\n[[disk]]\nname = \"near\"\nfile = \"/img/near.qcow2\"\n")
	got := Diff(run, want, Facts{SpareSlots: 1, BootMemory: run.Memory, NotLive: map[string]string{"far": "outside the image directories"}})
	if len(got) != 2 || got[1].Name != "far" || got[1].Class != Restart || got[1].Why != "outside the image directories" ||
		got[0].Name != "near" || got[0].Class != Live {
		t.Errorf("a disk the running VM cannot open:\n%s", lines(got))
	}
}

// A security group's change shows the groups as the file writes them
// (TOML inline tables, keys the file leaves out left out), not as Go
// structs (issue 47).
func TestDiffSecurityGroupShown(t *testing.T) {
	group := "[[security_group]]\nname = \"web\"\n[[security_group.rule]]\ndirection = \"in\"\nprotocol = \"tcp\"\nports = \"%s\"\n"
	run := parse(t, base+fmt.Sprintf(group, "80"))
	got := Diff(run, parse(t, base+fmt.Sprintf(group, "8080")), Facts{BootMemory: run.Memory})
	want := `live       security_group: [{name = "web", rule = [{direction = "in", protocol = "tcp", ports = "80"}]}] -> ` +
		`[{name = "web", rule = [{direction = "in", protocol = "tcp", ports = "8080"}]}] (nftables`
	if len(got) != 1 || !strings.HasPrefix(got[0].String(), want) {
		t.Errorf("a security group's port changed:\n%s\nwant %s...", lines(got), want)
	}
}

// TestDiffWhatApplyRefuses: plan classes by the facts apply's own checks
// give (issue 48: plan said live, apply refused): a disk in snapshots
// does not grow (impossible: apply refuses the file before changing
// anything), and a NIC on a host tap added to a VM started without one
// needs a restart; a user NIC still goes live.
func TestDiffWhatApplyRefuses(t *testing.T) {
	run := parse(t, base)
	grow := parse(t, edit(`file = "/img/root.qcow2"`, "file = \"/img/root.qcow2\"\nsize = \"1G\""))
	got := Diff(run, grow, Facts{BootMemory: run.Memory, Snapshotted: map[string]string{"root": "the disk is in snapshots"}})
	if len(got) != 1 || got[0].Class != Impossible || got[0].Why != "the disk is in snapshots" {
		t.Errorf("growing a disk in snapshots:\n%s", lines(got))
	}
	nics := parse(t, base+"[[nic]]\nname = \"vpc\"\ntype = \"network\"\nnetwork = \"n1\"\n[[nic]]\nname = \"u2\"\n")
	got = Diff(run, nics, Facts{SpareSlots: 4, BootMemory: run.Memory, TapsNotLive: "started without a tap NIC"})
	if len(got) != 2 || got[1].Name != "vpc" || got[1].Class != Restart || got[1].Why != "started without a tap NIC" ||
		got[0].Name != "u2" || got[0].Class != Live {
		t.Errorf("a network NIC on a VM without taps:\n%s", lines(got))
	}
}
