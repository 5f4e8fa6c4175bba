package netsetup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/netsetup"
)

// TestMain runs the package's tests in a network namespace of their own:
// every bridge, tap, OVS daemon and CNI network below lives there.
func TestMain(m *testing.M) {
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func needNetns(t *testing.T) {
	t.Helper()
	testenv.SkipUnlessRoot(t)
	if os.Getenv("VMSUP_TEST_PRIVATE_NETNS") == "" {
		t.Fatal("not in a private network namespace: refusing to touch the host's links")
	}
}

func addBridge(t *testing.T, name string, mtu int) {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(br) })
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
}

// TestTapOnBridge: a persistent tap with owner, MTU and MAC, attached to a
// bridge, then removed (twice: the second is a no-op).
func TestTapOnBridge(t *testing.T) {
	needNetns(t)
	addBridge(t, "br-t0", 1450)
	mtu, err := netsetup.CheckBridge("br-t0")
	if err != nil || mtu != 1450 {
		t.Fatalf("CheckBridge = %d, %v", mtu, err)
	}
	guest, _ := net.ParseMAC("52:54:00:12:34:56")
	tap := netsetup.Tap{Name: "vmt-test0", Owner: 4242, Group: 4243, MTU: 1400, GuestMAC: guest}
	t0 := time.Now()
	if err := netsetup.CreateTap(tap); err != nil {
		t.Fatal(err)
	}
	if err := netsetup.AttachBridge(tap.Name, "br-t0"); err != nil {
		t.Fatal(err)
	}
	t.Logf("tap created and attached in %s", time.Since(t0))
	l, err := netlink.LinkByName(tap.Name)
	if err != nil {
		t.Fatal(err)
	}
	tt, ok := l.(*netlink.Tuntap)
	if !ok {
		t.Fatalf("link is %T", l)
	}
	if tt.Owner != 4242 || tt.Group != 4243 || tt.MTU != 1400 || tt.HardwareAddr.String() != "fe:54:00:12:34:56" || tt.NonPersist {
		t.Errorf("tap = owner %d group %d mtu %d mac %s nonpersist %v", tt.Owner, tt.Group, tt.MTU, tt.HardwareAddr, tt.NonPersist)
	}
	if m, _ := netsetup.LinkMaster(tap.Name); m != "br-t0" {
		t.Errorf("master = %q", m)
	}
	if err := netsetup.CreateTap(tap); !errors.Is(err, netsetup.ErrExists) {
		t.Errorf("second CreateTap: %v, want ErrExists", err)
	}
	for range 2 {
		if err := netsetup.DeleteLink(tap.Name); err != nil {
			t.Fatal(err)
		}
	}
	if netsetup.LinkExists(tap.Name) {
		t.Error("tap still there")
	}
	if _, err := netsetup.CheckBridge("br-missing"); err == nil {
		t.Error("CheckBridge of a missing bridge succeeded")
	}
	if _, err := netsetup.CheckBridge("lo"); err == nil {
		t.Error("CheckBridge(lo) succeeded")
	}
}

// TestOVSStalePort: a port left by a crashed VM (its tap gone, so the port
// is in error) blocks the next add; AddPort removes it and retries once.
func TestOVSStalePort(t *testing.T) {
	needNetns(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	o, err := testenv.StartOVS(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	t.Logf("OVS up in %s", time.Since(t0))
	if err := o.AddBridge(ctx, "ovsbr0"); err != nil {
		t.Fatal(err)
	}
	ovs := netsetup.OVS{DB: o.DB}
	if err := ovs.CheckBridge(ctx, "ovsbr0"); err != nil {
		t.Fatal(err)
	}
	if err := ovs.CheckBridge(ctx, "nobr"); !errors.Is(err, netsetup.ErrNoBridge) {
		t.Fatalf("CheckBridge(nobr) = %v", err)
	}
	tap := netsetup.Tap{Name: "vmt-ovs0"}
	if err := netsetup.CreateTap(tap); err != nil {
		t.Fatal(err)
	}
	defer netsetup.DeleteLink(tap.Name)
	if removed, err := ovs.AddPort(ctx, "ovsbr0", tap.Name, "vm1"); err != nil || len(removed) > 0 {
		t.Fatalf("AddPort: %v %v", removed, err)
	}
	// The crash: the tap goes and its port stays; another crashed VM left a
	// port whose tap is gone too, which ovs-vswitchd shows in error.
	if err := netsetup.DeleteLink(tap.Name); err != nil {
		t.Fatal(err)
	}
	if err := o.Vsctl(ctx, "add-port", "ovsbr0", "vmt-gone"); err != nil {
		t.Fatal(err)
	}
	if e, _ := ovs.InterfaceError(ctx, "vmt-gone"); e == "" {
		t.Fatal("port vmt-gone not in error")
	} else {
		t.Logf("port in error: %s", e)
	}
	if err := netsetup.CreateTap(tap); err != nil {
		t.Fatal(err)
	}
	removed, err := ovs.AddPort(ctx, "ovsbr0", tap.Name, "vm1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, tap.Name) || !slices.Contains(removed, "vmt-gone") {
		t.Fatalf("AddPort removed %v, want the stale %s and vmt-gone", removed, tap.Name)
	}
	if br, _ := ovs.PortBridge(ctx, tap.Name); br != "ovsbr0" {
		t.Fatalf("port on %q", br)
	}
	if err := ovs.DelPort(ctx, tap.Name); err != nil {
		t.Fatal(err)
	}
	if err := ovs.DelPort(ctx, tap.Name); err != nil {
		t.Fatal("second DelPort:", err)
	}
	if ports, _ := ovs.ListPorts(ctx, "ovsbr0"); len(ports) != 0 {
		t.Fatalf("ports left: %v", ports)
	}
}

// TestCNIWireTap: ADD of a bridge + host-local conflist into a namespace
// vmsup makes, a tap joined to the CNI interface, CHECK, DEL; no lease is
// left and the namespace goes.
func TestCNIWireTap(t *testing.T) {
	needNetns(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	conf := writeConflist(t, dir, "cnitest", "cni-t0", "10.77.0.0/24")
	cni := netsetup.CNI{CacheDir: filepath.Join(dir, "cache")}
	nsm := netsetup.NamedNetns{Dir: filepath.Join(dir, "netns")}
	p, err := nsm.Create(ctx, "vm1")
	if err != nil {
		t.Fatal(err)
	}
	defer nsm.Delete(ctx, "vm1")
	a := netsetup.CNIAttachment{Config: conf, ContainerID: "vmsup-vm1", IfName: netsetup.CNIIfName("pod"), Netns: p.Host}
	t0 := time.Now()
	res, err := cni.Add(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CNI ADD in %s: %+v", time.Since(t0), res)
	if len(res.Addresses) != 1 || res.Gateway != "10.77.0.1" {
		t.Fatalf("result %+v", res)
	}
	if err := netsetup.WireTap(p.Host, netsetup.Tap{Name: "vmt-cni0"}, a.IfName); err != nil {
		t.Fatal(err)
	}
	if err := cni.Check(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n := leases(t, dir); n != 1 {
		t.Fatalf("%d leases after ADD", n)
	}
	if err := cni.Del(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := cni.Del(ctx, a); err != nil {
		t.Fatal("second DEL:", err)
	}
	if n := leases(t, dir); n != 0 {
		t.Fatalf("%d leases after DEL", n)
	}
	if err := nsm.Delete(ctx, "vm1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.Host); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("netns file still there: %v", err)
	}
	// An invalid config fails at load, naming the file.
	bad := filepath.Join(dir, "bad.conflist")
	os.WriteFile(bad, []byte(`{"cniVersion":"1.0.0","name":"bad","plugins":[{"type":"no-such-plugin"}]}`), 0o644)
	if _, err := cni.Load(ctx, bad); err == nil {
		t.Fatal("Load of a config with a missing plugin succeeded")
	} else {
		t.Logf("invalid config: %v", err)
	}
}

// writeConflist writes a bridge + host-local network whose leases go under
// dir/ipam.
func writeConflist(t *testing.T, dir, name, bridge, subnet string) string {
	t.Helper()
	body := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]]}
  }]
}`, name, bridge, filepath.Join(dir, "ipam"), subnet)
	p := filepath.Join(dir, name+".conflist")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// leases counts host-local's lease files (one per address in use).
func leases(t *testing.T, dir string) int {
	n := 0
	filepath.Walk(filepath.Join(dir, "ipam"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && net.ParseIP(filepath.Base(p)) != nil {
			n++
		}
		return nil
	})
	return n
}
