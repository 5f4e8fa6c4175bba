package netmanage_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/net/nicfilter"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/supervisor"
)

// hotNIC: `vmsup nic attach --type network --network` puts a running
// guest on the managed network, with the [[nic]] fields as flags (issue
// 48: --network was an unknown flag, so no NIC could be hot-plugged onto a
// managed network): the guest sees the NIC, dnsmasq leases it the address
// given by --ip, status shows its network and security group; detach
// leaves nothing of it.
func hotNIC(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, g *guest) {
	const mac, ip = "52:54:00:77:00:60", "10.77.0.60"
	out, err := cli(ctx, sup, "nic", "attach", g.name, "hot", "--type", "network", "--network", labNet,
		"--ip", ip, "--mac", mac, "--security-group", "web")
	if err != nil {
		t.Fatalf("nic attach --type network: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(out))
	st, err := sup.Status(ctx, g.name)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(st.NICs, func(n supervisor.NICInfo) bool { return n.Name == "hot" })
	if i < 0 || st.NICs[i].Network != labNet || !slices.Equal(st.NICs[i].SecurityGroups, []string{"web"}) || !st.NICs[i].TapUp || st.NICs[i].MAC != mac {
		t.Fatalf("status after the attach: %+v", st.NICs)
	}
	tap := st.NICs[i].Tap
	find := fmt.Sprintf(`for i in /sys/class/net/*; do [ "$(cat $i/address)" = %s ] && echo "${i##*/}"; done; true`, mac)
	var dev string
	for deadline := time.Now().Add(30 * time.Second); dev == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		dev = strings.TrimSpace(g.run(t, ctx, find))
	}
	if dev == "" {
		t.Fatalf("the guest has no NIC with MAC %s", mac)
	}
	g.run(t, ctx, fmt.Sprintf("ip link set %s up && udhcpc -i %s -s /etc/udhcpc.script -q -n -t 10 -T 1 >/dev/null 2>&1", dev, dev))
	if out := g.run(t, ctx, "ip -4 -o addr show dev "+dev); !strings.Contains(out, " "+ip+"/") {
		t.Fatalf("%s's hot NIC %s after DHCP: %q, want %s (its lease on %s)", g.name, dev, out, ip, labNet)
	}
	t.Logf("the guest's %s got %s from %s's dnsmasq", dev, ip, labNet)

	if out, err := cli(ctx, sup, "nic", "detach", g.name, "hot"); err != nil {
		t.Fatalf("nic detach: %v\n%s", err, out)
	}
	gone := func() bool {
		return !netsetup.LinkExists(tap) && strings.TrimSpace(g.run(t, ctx, find)) == "" &&
			!slices.ContainsFunc(vmsupTables(t), func(s string) bool { return slices.Contains(nicfilter.TableNames(tap), s) })
	}
	for deadline := time.Now().Add(20 * time.Second); !gone(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the detach: tap %s present %v, or the guest's NIC or its filter left", tap, netsetup.LinkExists(tap))
		}
	}
}
