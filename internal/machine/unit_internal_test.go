package machine

import (
	"slices"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestShutdownAfter: VMs that use the host network are ordered after it (and
// after Open vSwitch for ovs NICs), so host shutdown stops them first.
func TestShutdownAfter(t *testing.T) {
	for _, c := range []struct {
		body string
		want []string
	}{
		{"", nil},
		{"[[nic]]\nname = \"n\"\ntype = \"bridge\"\nbridge = \"br0\"\n", []string{"network.target"}},
		{"[[nic]]\nname = \"n\"\ntype = \"ovs\"\nbridge = \"ovsbr0\"\n", []string{"network.target", "openvswitch-switch.service"}},
		{"[[disk]]\nname = \"d\"\ntype = \"iscsi\"\nportal = \"127.0.0.1:3260\"\ntarget = \"iqn.2026-11.test:t\"\nlun = 1\n", []string{"network.target"}},
	} {
		f, err := spec.Parse("/tmp/vm.toml", []byte("name = \"vm\"\nmemory = \"128M\"\n"+c.body+"[boot]\nkernel = \"/boot/vmlinuz\"\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := shutdownAfter(&f.VM); !slices.Equal(got, c.want) {
			t.Errorf("%q: After %q, want %q", c.body, got, c.want)
		}
	}
}
