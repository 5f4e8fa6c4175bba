package spec

import (
	"strings"
	"testing"
)

const nicBase = "name='web'\nmemory='1G'\ncpus=3\n[boot]\nkernel='k'\n"

func TestTapNICDefaults(t *testing.T) {
	f, err := Parse("/etc/vmsup/web.toml", []byte(nicBase+`
[[nic]]
name = 'lan'
type = 'bridge'
bridge = 'br0'
[[nic]]
name = 'up'
type = 'ovs'
bridge = 'ovsbr0'
multiqueue = true
vhost = 'off'
`))
	if err != nil {
		t.Fatal(err)
	}
	lan, up := f.VM.NICs[0], f.VM.NICs[1]
	if lan.Tap != DeriveTap("web", "lan") || len(lan.Tap) > MaxIfName || lan.Vhost != VhostAuto || lan.Queues != 1 {
		t.Errorf("lan defaults: %+v", lan)
	}
	if up.Queues != 3 || up.Vhost != VhostOff || up.Tap == lan.Tap {
		t.Errorf("up defaults: %+v", up)
	}
	if a, b := DeriveTap("web", "lan"), DeriveTap("web", "lan"); a != b || a == DeriveTap("web2", "lan") {
		t.Error("DeriveTap is not stable or not distinct")
	}
	g, err := Parse("/etc/vmsup/web.toml", []byte(nicBase+"[[nic]]\nname='pod'\ntype='cni'\ncni_config='net.d/pod.conflist'\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := g.VM.NICs[0].CNIConfig; got != "/etc/vmsup/net.d/pod.conflist" {
		t.Errorf("cni_config resolved to %q", got)
	}
}

func TestTapNICErrors(t *testing.T) {
	for _, c := range []struct{ name, nic, want string }{
		{"bridge without name", "type='bridge'", `nic[0].bridge: nic "n": type "bridge" needs bridge`},
		{"bridge too long", "type='bridge'\nbridge='br-0123456789abc'", `nic[0].bridge: nic "n": interface name "br-0123456789abc" is longer than 15 bytes`},
		{"bad bridge name", "type='ovs'\nbridge='br 0'", `nic[0].bridge: nic "n": invalid interface name`},
		{"tap too long", "type='bridge'\nbridge='br0'\ntap='tap-0123456789ab'", `nic[0].tap: nic "n": interface name`},
		{"mtu", "type='bridge'\nbridge='br0'\nmtu=20", `nic[0].mtu: nic "n": 20 is out of range`},
		{"queues", "type='bridge'\nbridge='br0'\nqueues=999", `nic[0].queues: nic "n": 999 is out of range`},
		{"vhost", "type='bridge'\nbridge='br0'\nvhost='yes'", `nic[0].vhost: nic "n": invalid value "yes"`},
		{"cni without config", "type='cni'", `nic[0].cni_config: nic "n": type "cni" needs cni_config`},
		{"cni with bridge", "type='cni'\ncni_config='/x.conflist'\nbridge='br0'", `nic[0].bridge: nic "n": is not used by type "cni"`},
		{"user with bridge", "bridge='br0'", `nic[0].bridge: nic "n": is not used by type "user"`},
		{"user with mtu", "mtu=1400", `nic[0].type: nic "n": mtu, queues, multiqueue and vhost need a tap NIC`},
		{"tap with forwards", "type='bridge'\nbridge='br0'\nforwards=['tcp::2222-:22']", `nic[0].forwards: nic "n": host forwards need type "user"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("/etc/vmsup/web.toml", []byte(nicBase+"[[nic]]\nname='n'\n"+c.nic+"\n"))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
	_, err := Parse("/etc/vmsup/web.toml", []byte(nicBase+"[[nic]]\nname='a'\ntype='bridge'\nbridge='br0'\ntap='t0'\n[[nic]]\nname='b'\ntype='ovs'\nbridge='o0'\ntap='t0'\n"))
	if err == nil || !strings.Contains(err.Error(), `nic[1].tap: nic "b": tap "t0" is also the tap of nic[0] "a"`) {
		t.Fatalf("duplicate tap: %v", err)
	}
}
