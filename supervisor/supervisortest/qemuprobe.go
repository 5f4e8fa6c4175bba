package supervisortest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// What HotVM's checks look at, from QEMU's and the host's side rather than
// from vmsup's records: the records are what the checks compare against.

// diskParts are the ids of what QEMU has of a plugged disk.
func diskParts(t *testing.T, d spec.Disk) []string {
	p, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: "/dev/null", SecretFile: "/dev/null"}, "rp1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range p.Devices {
		ids = append(ids, x.ID)
	}
	for _, x := range p.Blockdevs {
		ids = append(ids, x.NodeName)
	}
	for _, x := range p.Objects {
		ids = append(ids, x.ID)
	}
	return ids
}

// rawQMP runs one QMP command on the VM and decodes the reply into out.
func rawQMP(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm, cmd string, out any) {
	t.Helper()
	b, err := sup.QMP(ctx, vm, []byte(cmd), false)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, b)
	}
}

// qemuHas is every id QEMU knows: devices, block nodes, objects, netdevs.
func qemuHas(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string) map[string]bool {
	t.Helper()
	have := map[string]bool{}
	for _, path := range []string{"/machine/peripheral", "/objects"} {
		var r struct {
			Return []struct{ Name string } `json:"return"`
		}
		rawQMP(t, ctx, sup, vm, fmt.Sprintf(`{"execute":"qom-list","arguments":{"path":%q}}`, path), &r)
		for _, x := range r.Return {
			have[x.Name] = true
		}
	}
	var nodes struct {
		Return []struct {
			NodeName string `json:"node-name"`
		} `json:"return"`
	}
	rawQMP(t, ctx, sup, vm, `{"execute":"query-named-block-nodes","arguments":{"flat":true}}`, &nodes)
	for _, n := range nodes.Return {
		have[n.NodeName] = true
	}
	// Netdevs have no QMP query in QEMU 7.2 but "info network".
	var hmp struct {
		Return string `json:"return"`
	}
	rawQMP(t, ctx, sup, vm, `{"execute":"human-monitor-command","arguments":{"command-line":"info network"}}`, &hmp)
	for _, l := range strings.Split(hmp.Return, "\n") {
		l = strings.TrimLeft(l, " \\_")
		if id, _, ok := strings.Cut(l, ":"); ok && strings.HasPrefix(id, "net-") {
			have[id] = true
		}
	}
	return have
}

// namedACL lists the named-user entries on path's ACL (none if it is gone).
func namedACL(t *testing.T, path string) []string {
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	out, err := exec.Command("getfacl", "--omit-header", "--absolute-names", "--numeric", path).Output()
	if err != nil {
		t.Fatalf("getfacl %s: %v", path, err)
	}
	var named []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Split(l, ":"); len(f) == 3 && f[0] == "user" && f[1] != "" {
			named = append(named, l)
		}
	}
	return named
}

// taps lists the tap devices in this network namespace.
func taps(t *testing.T) []string {
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Type() == "tuntap" {
			out = append(out, l.Attrs().Name)
		}
	}
	slices.Sort(out)
	return out
}
