package spec

import (
	"strings"
	"testing"
)

// The keys apply can change live: I/O limits, link state, the health gate.
func TestLiveKeys(t *testing.T) {
	f, err := Parse("/etc/vmsup/web.toml", []byte(base+"[[disk]]\nname='d'\nfile='d.raw'\niops=100\nbps_read='10M'\n"+
		"[[nic]]\nname='n'\nlink='down'\n[health]\nconsole='READY'\ntimeout='30s'\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := f.VM.Disks[0]
	if d.IOPS != 100 || d.BPSRead != 10*MiB || !d.Limited() {
		t.Errorf("limits: %+v", d.IOLimits)
	}
	if f.VM.NICs[0].LinkIsUp() {
		t.Error("link = down parsed as up")
	}
	if h := f.VM.Health; h.Console != "READY" || h.Timeout.D().Seconds() != 30 || h.Agent != nil {
		t.Errorf("health: %+v", h)
	}
	g, err := Parse("/etc/vmsup/web.toml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	// Unset, the timeout stays zero: the restart sizes it to the host
	// (hostcaps.HealthTimeout), and a record written back parses the same.
	if g.VM.Health.Timeout != 0 {
		t.Errorf("health timeout unset: %s", g.VM.Health.Timeout.D())
	}
	if h, err := New("web", g.VM); err != nil || h.VM.Health.Timeout != 0 {
		t.Errorf("health timeout unset, written back: %v, %v", err, h)
	}
}

func TestLiveKeysBad(t *testing.T) {
	for _, c := range []struct{ toml, want string }{
		{"[[disk]]\nname='d'\nfile='a'\niops=-1\n", "disk[0].iops: must not be negative"},
		{"[[disk]]\nname='d'\nfile='a'\niops=10\niops_read=5\n", "disk[0].iops: give iops, or iops_read/iops_write, not both"},
		{"[[disk]]\nname='d'\nfile='a'\nbps='1M'\nbps_write='1M'\n", "disk[0].bps: give bps"},
		{"[[disk]]\nname='d'\ntype='iso'\nfile='a.iso'\niops=10\n", "disk[0].iops: I/O limits apply to disks"},
		{"[[nic]]\nname='n'\nlink='sideways'\n", `nic[0].link: nic "n": invalid value "sideways"`},
		{"[health]\ntimeout='2h'\n", "health.timeout: 2h0m0s is out of range"},
		{"[health]\nconsole=\"a\\nb\"\n", "health.console: the marker is one line"},
		{"guest_agent=false\n[health]\nagent=true\n", "health.agent: needs the guest agent channel"},
		{"balloon_target='256M'\n", "balloon_target: needs the balloon device"},
		{"balloon=true\nballoon_target='1G'\n", "balloon_target: 1G must be a whole number of MiB from 64M to max_memory (512M)"},
	} {
		toml := c.toml
		if strings.HasPrefix(toml, "balloon") {
			toml = "name='web'\nmemory='512M'\n" + toml + "[boot]\nkernel='k'\n"
		} else if strings.HasPrefix(toml, "guest_agent") {
			toml = "name='web'\nmemory='512M'\n" + toml + "[boot]\nkernel='k'\n"
			toml = strings.Replace(toml, "[health]\nagent=true\n[boot]\nkernel='k'\n", "[boot]\nkernel='k'\n[health]\nagent=true\n", 1)
		} else {
			toml = base + toml
		}
		_, err := Parse("web.toml", []byte(toml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.toml, err, c.want)
		}
	}
}
