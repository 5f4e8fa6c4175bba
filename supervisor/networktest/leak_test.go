package networktest

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestUpDownCycles: 50 up/down cycles of a VM with a bridge and an OVS NIC
// and of one with a CNI NIC, through the real up and down paths (QEMU
// starts and answers QMP; the guest need not boot: down ends by quit after
// the short stop timeout). The test counts links, OVS ports, namespaces,
// IPAM leases and net.json files while the VMs run and after each down.
func TestUpDownCycles(t *testing.T) {
	cycles := 50
	if testing.Short() {
		cycles = 5
	}
	ctx := ctxT(t, 20*time.Minute)
	sup := newSup(t)
	// NIC a is multi-queue: vmsup makes a multi-queue tap, QEMU opens
	// its 2 queues by name.
	tapVM := guestFile(t, "cyctap", "", `stop_timeout = "300ms"
cpus = 2
[[nic]]
name = "a"
type = "bridge"
bridge = "`+linuxBridge+`"
multiqueue = true

[[nic]]
name = "b"
type = "ovs"
bridge = "`+ovsBridge+`"
`)
	cniVM := guestFile(t, "cyccni", "", `stop_timeout = "300ms"
[[nic]]
name = "c"
type = "cni"
cni_config = "`+cniConf+`"
`)
	base := links(t)
	base[cniBridge] = true // the CNI bridge plugin makes it once and keeps it
	basePorts := ovsPorts(t, ctx)
	var upTotal, downTotal time.Duration
	for i := range cycles {
		t0 := time.Now()
		if _, err := sup.Up(ctx, tapVM, cniVM); err != nil {
			t.Fatalf("cycle %d: up: %v", i, err)
		}
		upTotal += time.Since(t0)
		// While up: two taps and the CNI veth's host end, one port, one
		// namespace, one lease.
		extra := []string{}
		for l := range links(t) {
			if !base[l] {
				extra = append(extra, l)
			}
		}
		if len(extra) != 3 || len(ovsPorts(t, ctx)) != len(basePorts)+1 || len(sandboxNetns(t)) != 1 || leases(t) != 1 {
			t.Fatalf("cycle %d while up: new links %v, ports %v, namespaces %v, leases %d",
				i, extra, ovsPorts(t, ctx), sandboxNetns(t), leases(t))
		}
		t1 := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, name := range []string{"cyctap", "cyccni"} {
			wg.Go(func() { _, errs[j] = sup.Down(ctx, name) })
		}
		wg.Wait()
		downTotal += time.Since(t1)
		for _, err := range errs {
			if err != nil {
				t.Fatalf("cycle %d: down: %v", i, err)
			}
		}
		if err := leftovers(t, sup, base, basePorts); err != "" {
			t.Fatalf("cycle %d after down: %s", i, err)
		}
	}
	t.Logf("%d cycles of 2 VMs: up %s/cycle, down (both at once) %s/cycle; nothing left behind",
		cycles, upTotal/time.Duration(cycles), downTotal/time.Duration(cycles))
}

// leftovers describes what the network steps left behind ("" if nothing).
func leftovers(t testing.TB, sup *supervisor.Supervisor, base map[string]bool, basePorts []string) string {
	var out []string
	now := links(t)
	if !maps.Equal(now, base) {
		out = append(out, fmt.Sprintf("links %v (before %v)", slices.Sorted(maps.Keys(now)), slices.Sorted(maps.Keys(base))))
	}
	if p := ovsPorts(t, t.Context()); !slices.Equal(p, basePorts) {
		out = append(out, fmt.Sprintf("OVS ports %v", p))
	}
	if ns := sandboxNetns(t); len(ns) > 0 {
		out = append(out, fmt.Sprintf("namespaces %v", ns))
	}
	if n := leases(t); n > 0 {
		out = append(out, fmt.Sprintf("%d leases", n))
	}
	if js, _ := filepath.Glob(filepath.Join(sup.Root(), "records", "*", "net.json")); len(js) > 0 {
		out = append(out, fmt.Sprintf("state %v", js))
	}
	return strings.Join(out, "; ")
}

// TestBadInput: each bad NIC fails up (or parsing) with one line naming the
// NIC and its field, and leaves nothing behind: no unit, no state
// directory, no link, port, namespace or lease, even when one NIC was made
// before another failed.
func TestBadInput(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	sup := newSup(t)
	dir := t.TempDir()
	badJSON := filepath.Join(dir, "bad.conflist")
	os.WriteFile(badJSON, []byte(`{"cniVersion": "1.0.0", "name": "bad", "plugins": [`), 0o644)
	noPlugin := filepath.Join(dir, "noplugin.conflist")
	os.WriteFile(noPlugin, []byte(`{"cniVersion": "1.0.0", "name": "np", "plugins": [{"type": "no-such-plugin"}]}`), 0o644)
	base := links(t)
	basePorts := ovsPorts(t, ctx)
	for _, c := range []struct {
		name, nics string
		parse      bool // the file itself is refused
		want       []string
	}{
		{"missing bridge", `[[nic]]
name = "lan"
type = "bridge"
bridge = "nosuchbr0"
`, false, []string{`nic[0].bridge: nic "lan"`, `no Linux bridge "nosuchbr0"`}},
		{"not a bridge", `[[nic]]
name = "lan"
type = "bridge"
bridge = "lo"
`, false, []string{`nic[0].bridge: nic "lan"`, "not a Linux bridge"}},
		{"missing OVS bridge", `[[nic]]
name = "up"
type = "ovs"
bridge = "nosuchovs0"
`, false, []string{`nic[0].bridge: nic "up"`, `no such OVS bridge "nosuchovs0"`}},
		{"bridge name too long", `[[nic]]
name = "lan"
type = "bridge"
bridge = "a-very-long-bridge0"
`, true, []string{`nic[0].bridge: nic "lan"`, "longer than 15 bytes"}},
		{"duplicate MACs", `[[nic]]
name = "a"
type = "bridge"
bridge = "` + linuxBridge + `"
mac = "52:54:00:00:00:01"

[[nic]]
name = "b"
type = "ovs"
bridge = "` + ovsBridge + `"
mac = "52:54:00:00:00:01"
`, true, []string{`nic[1].mac: nic "b": duplicate MAC`, `nic[0] "a"`}},
		{"invalid CNI JSON", `[[nic]]
name = "pod"
type = "cni"
cni_config = "` + badJSON + `"
`, false, []string{`nic[0].cni_config: nic "pod"`, badJSON}},
		{"CNI plugin missing", `[[nic]]
name = "pod"
type = "cni"
cni_config = "` + noPlugin + `"
`, false, []string{`nic[0].cni_config: nic "pod"`, `no-such-plugin`}},
		{"vhost on without /dev/vhost-net", `[[nic]]
name = "fast"
type = "bridge"
bridge = "` + linuxBridge + `"
vhost = "on"
`, false, []string{`nic[0].vhost: nic "fast"`, "/dev/vhost-net"}},
		{"second NIC fails after the first was made", `[[nic]]
name = "ok"
type = "bridge"
bridge = "` + linuxBridge + `"

[[nic]]
name = "clash"
type = "bridge"
bridge = "` + linuxBridge + `"
tap = "` + linuxBridge + `"
`, false, []string{`nic "clash"`, "not a tap"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.toml")
			os.WriteFile(path, []byte(fmt.Sprintf("name = \"bad\"\nmemory = \"256M\"\naccel = \"tcg\"\nstop_timeout = \"1s\"\n[boot]\nkernel = %q\n\n%s", env.Guest.Kernel, c.nics)), 0o644)
			f, err := spec.Load(path)
			if c.parse {
				if err == nil {
					t.Fatal("the file parsed")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				_, err = sup.Up(ctx, f)
			}
			if err == nil {
				t.Fatal("up succeeded")
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			t.Logf("%s", msg)
			if _, err := os.Stat(filepath.Join(sup.Root(), "vms", "bad")); !os.IsNotExist(err) {
				t.Errorf("state directory left: %v", err)
			}
			if out, _ := env.Systemd.Systemctl(ctx, "is-active", "vmsup-bad.service"); !strings.Contains(string(out), "inactive") {
				t.Errorf("unit exists: %s", out)
			}
			if l := leftovers(t, sup, base, basePorts); l != "" {
				t.Errorf("left behind: %s", l)
			}
		})
	}
}
