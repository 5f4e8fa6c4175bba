package networktest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestBridgeGuestAndHotplug: a guest on a Linux bridge gets its address
// from the kernel command line and pings the bridge's address, and the host
// pings it. Then an OVS NIC is hot-plugged: the guest sees eth1, passes
// traffic on it, and loses it on detach, with the tap and port gone. On
// down the bridge tap is gone.
func TestBridgeGuestAndHotplug(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	sup := newSup(t)
	f := guestFile(t, "brvm", "vmsup.ip=10.88.0.10/24", `
[[nic]]
name = "lan"
type = "bridge"
bridge = "`+linuxBridge+`"
`)
	tap := f.VM.NICs[0].Tap
	t0 := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Logf("up in %s", time.Since(t0))
	if m, _ := netsetup.LinkMaster(tap); m != linuxBridge {
		t.Fatalf("tap %s on %q, want %s", tap, m, linuxBridge)
	}
	st, err := sup.Status(ctx, "brvm")
	if err != nil || len(st.NICs) != 1 || st.NICs[0].Bridge != linuxBridge || !st.NICs[0].TapUp {
		t.Fatalf("status NICs %+v %v", st.NICs, err)
	}
	g := shell(t, ctx, sup, "brvm")
	t.Logf("guest shell after %s", time.Since(t0))
	guestRun(t, ctx, g, "ping -c 1 -W 5 "+linuxHost)
	hostPing(t, ctx, "10.88.0.10")

	// Hotplug an OVS NIC.
	t1 := time.Now()
	n, err := sup.AttachNIC(ctx, "brvm", spec.NIC{Name: "hot", Type: spec.NICOVS, Bridge: ovsBridge})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attached %s (tap %s, mac %s) in %s", n.Name, n.Tap, n.MAC, time.Since(t1))
	if !slices.Contains(ovsPorts(t, ctx), n.Tap) {
		t.Fatalf("tap %s not a port of %s: %v", n.Tap, ovsBridge, ovsPorts(t, ctx))
	}
	// The guest sees a second interface with the NIC's MAC.
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		out, _, _ = g.Run(ctx, "cat /sys/class/net/eth1/address")
		if strings.Contains(out, n.MAC) {
			break
		}
	}
	if !strings.Contains(out, n.MAC) {
		t.Fatalf("guest has no eth1 with %s: %q", n.MAC, out)
	}
	guestRun(t, ctx, g, "ip addr add 10.89.0.11/24 dev eth1 && ip link set eth1 up")
	guestRun(t, ctx, g, "ping -c 1 -W 5 "+ovsHost)
	hostPing(t, ctx, "10.89.0.11")
	st, _ = sup.Status(ctx, "brvm")
	if len(st.NICs) != 2 || !st.NICs[1].Hotplug || st.NICs[1].Bridge != ovsBridge {
		t.Fatalf("status after attach: %+v", st.NICs)
	}
	// A second NIC with the same MAC is refused, naming the NIC; nothing made.
	before := links(t)
	if _, err := sup.AttachNIC(ctx, "brvm", spec.NIC{Name: "dup", Type: spec.NICBridge, Bridge: linuxBridge, MAC: n.MAC}); err == nil ||
		!strings.Contains(err.Error(), `nic "dup"`) || !strings.Contains(err.Error(), "duplicate MAC") {
		t.Fatalf("attach with a duplicate MAC: %v", err)
	} else {
		t.Logf("duplicate MAC refused: %v", err)
	}
	if _, err := sup.AttachNIC(ctx, "brvm", spec.NIC{Name: "nobr", Type: spec.NICBridge, Bridge: "nosuchbr0"}); err == nil ||
		!strings.Contains(err.Error(), `nic "nobr"`) || !strings.Contains(err.Error(), `no Linux bridge "nosuchbr0"`) {
		t.Fatalf("attach to a missing bridge: %v", err)
	} else {
		t.Logf("missing bridge refused: %v", err)
	}
	if after := links(t); len(after) != len(before) {
		t.Fatalf("links changed on a refused attach: %v -> %v", before, after)
	}

	t2 := time.Now()
	if err := sup.DetachNIC(ctx, "brvm", "hot"); err != nil {
		t.Fatal(err)
	}
	t.Logf("detached in %s", time.Since(t2))
	if _, code, _ := g.Run(ctx, "test -e /sys/class/net/eth1"); code == 0 {
		t.Fatal("guest still has eth1 after detach")
	}
	if netsetup.LinkExists(n.Tap) || slices.Contains(ovsPorts(t, ctx), n.Tap) {
		t.Fatalf("tap %s or its port still there after detach", n.Tap)
	}
	// The boot-time NIC still works.
	guestRun(t, ctx, g, "ping -c 1 -W 5 "+linuxHost)

	// Default MACs never collide: attach a, attach b, detach a, attach c
	// (a MAC derived from a count gave c the MAC of b).
	macs := map[string]string{}
	for _, s := range []struct{ op, nic string }{{"attach", "ma"}, {"attach", "mb"}, {"detach", "ma"}, {"attach", "mc"}, {"detach", "mb"}, {"detach", "mc"}} {
		if s.op == "detach" {
			if err := sup.DetachNIC(ctx, "brvm", s.nic); err != nil {
				t.Fatalf("detach %s: %v", s.nic, err)
			}
			continue
		}
		n, err := sup.AttachNIC(ctx, "brvm", spec.NIC{Name: s.nic, Type: spec.NICBridge, Bridge: linuxBridge})
		if err != nil {
			t.Fatalf("attach %s: %v", s.nic, err)
		}
		macs[s.nic] = n.MAC
	}
	if macs["mc"] == macs["mb"] || macs["ma"] == macs["mb"] {
		t.Fatalf("default MACs collide: %v", macs)
	}

	// The same through the CLI: attach, status, detach.
	out = vmsup(t, ctx, sup, "nic", "attach", "brvm", "hot2", "--type", "bridge", "--bridge", linuxBridge, "--mtu", "1400")
	if !strings.Contains(out, "brvm: nic hot2 attached (type bridge") {
		t.Fatalf("vmsup nic attach: %s", out)
	}
	out = vmsup(t, ctx, sup, "status", "brvm")
	if !strings.Contains(out, "hot2 bridge mac 52:54:00:") || !strings.Contains(out, " tap vmt") || !strings.Contains(out, "on "+linuxBridge+" hot-plugged") {
		t.Fatalf("vmsup status:\n%s", out)
	}
	t.Logf("vmsup status:\n%s", out)
	guestRun(t, ctx, g, "for i in $(seq 50); do test -e /sys/class/net/eth1 && break; sleep 0.2; done; test \"$(cat /sys/class/net/eth1/mtu)\" = 1400")
	if out := vmsup(t, ctx, sup, "nic", "detach", "brvm", "hot2"); !strings.Contains(out, "brvm: nic hot2 detached") {
		t.Fatalf("vmsup nic detach: %s", out)
	}
	if out, err := vmsupErr(ctx, sup, "nic", "detach", "brvm", "lan"); err == nil || !strings.Contains(out, `nic "lan" is in the VM's file`) {
		t.Fatalf("detach of a boot NIC: %v %s", err, out)
	}

	if _, err := sup.Down(ctx, "brvm"); err != nil {
		t.Fatal(err)
	}
	if netsetup.LinkExists(tap) {
		t.Fatalf("tap %s still there after down", tap)
	}
}

// TestOVSGuestCrash: a guest on OVS pings the bridge's address and is
// pinged; after kill -9 of QEMU the unit's stop-post hook removes tap and
// port; with a stale tap and port put back (as a run whose hook never ran
// leaves them), the next up finds and replaces them; systemctl stop
// removes both through the same hook.
func TestOVSGuestCrash(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	sup, log := newSupLog(t)
	f := guestFile(t, "ovsvm", "vmsup.ip=10.89.0.20/24", `stop_timeout = "5s"
[[nic]]
name = "uplink"
type = "ovs"
bridge = "`+ovsBridge+`"
`)
	tap := f.VM.NICs[0].Tap
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	g := shell(t, ctx, sup, "ovsvm")
	guestRun(t, ctx, g, "ping -c 1 -W 5 "+ovsHost)
	hostPing(t, ctx, "10.89.0.20")
	g.Close()

	pids, err := env.Systemd.HostPIDs("vmsup-ovsvm.service")
	if err != nil || len(pids) != 1 {
		t.Fatalf("QEMU pids %v %v", pids, err)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The hook removes the tap before it logs, and journald takes the line
	// after that: the journal is read until it has it (a full run once read
	// it between the two).
	const removed = "vmsup stop-post ovsvm: network removed"
	var st supervisor.Status
	var journal string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, _ = sup.Status(ctx, "ovsvm")
		if st.State == supervisor.StateCrashed && !netsetup.LinkExists(tap) {
			if journal, _ = env.Systemd.Journal(ctx, "vmsup-ovsvm.service"); strings.Contains(journal, removed) {
				break
			}
		}
	}
	if st.State != supervisor.StateCrashed {
		t.Fatalf("after kill -9: %+v", st)
	}
	if !strings.Contains(journal, removed) {
		t.Fatalf("stop-post did not run; journal:\n%s", journal)
	}
	if netsetup.LinkExists(tap) || slices.Contains(ovsPorts(t, ctx), tap) {
		t.Fatalf("stop-post left tap %s or its port", tap)
	}
	// The leftovers of a run whose hook never ran: the persistent tap and
	// its port.
	if err := netsetup.CreateTap(netsetup.Tap{Name: tap}); err != nil {
		t.Fatal(err)
	}
	if err := ovs.Vsctl(ctx, "add-port", ovsBridge, tap); err != nil {
		t.Fatal(err)
	}
	res, err := sup.Up(ctx, f)
	if err != nil {
		t.Fatalf("up after kill -9 with a stale tap and port: %v", err)
	}
	t.Logf("up after crash: %+v", res[0])
	for _, want := range []string{"removing a stale tap", "removed stale OVS ports"} {
		if !strings.Contains(log.String(), want) {
			t.Fatalf("up did not log %q; log:\n%s", want, log.String())
		}
	}
	t.Logf("stale clean-up by up:\n%s", log.String())
	if ports := ovsPorts(t, ctx); !slices.Contains(ports, tap) {
		t.Fatalf("port missing after up: %v", ports)
	}
	if e, _ := (netsetup.OVS{DB: ovs.DB}).InterfaceError(ctx, tap); e != "" {
		t.Fatalf("port in error after up: %s", e)
	}
	g = shell(t, ctx, sup, "ovsvm")
	guestRun(t, ctx, g, "ping -c 1 -W 5 "+ovsHost)
	// systemctl stop (not vmsup down): ExecStop= powers the guest off,
	// ExecStopPost= removes tap and port.
	if out, err := env.Systemd.Systemctl(ctx, "stop", "vmsup-ovsvm.service"); err != nil {
		t.Fatalf("systemctl stop: %v\n%s", err, out)
	}
	if netsetup.LinkExists(tap) || slices.Contains(ovsPorts(t, ctx), tap) {
		t.Fatalf("tap %s or port left after systemctl stop", tap)
	}
	if dr, err := sup.Down(ctx, "ovsvm"); err != nil || dr.Step != supervisor.StoppedAlready {
		t.Fatalf("down after systemctl stop: %+v %v", dr, err)
	}
}

// TestCNIGuest: a guest wired by a CNI bridge + host-local network in the
// namespace vmsup makes (its unit runs there) takes the address ADD gave,
// pings the gateway and is pinged; status shows CHECK ok; down runs DEL and
// the namespace and lease are gone.
func TestCNIGuest(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	sup := newSup(t)
	f := guestFile(t, "cnivm", "", `
[[nic]]
name = "pod"
type = "cni"
cni_config = "`+cniConf+`"
`)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	st, err := sup.Status(ctx, "cnivm")
	if err != nil || len(st.NICs) != 1 || st.NICs[0].CNICheck != "ok" || len(st.NICs[0].Addrs) != 1 || !st.NICs[0].TapUp {
		t.Fatalf("status NICs %+v %v", st.NICs, err)
	}
	n := st.NICs[0]
	t.Logf("CNI NIC: %+v", n)
	if n.Gateway != cniHost {
		t.Fatalf("gateway %s, want %s", n.Gateway, cniHost)
	}
	if leases(t) != 1 || !slices.Contains(sandboxNetns(t), "vmsup-cnivm") {
		t.Fatalf("leases %d, namespaces %v", leases(t), sandboxNetns(t))
	}
	unitNS, _ := env.Systemd.Systemctl(ctx, "show", "-p", "NetworkNamespacePath", "vmsup-cnivm.service")
	if !strings.Contains(string(unitNS), "/run/netns/vmsup-cnivm") {
		t.Fatalf("unit not in the namespace: %s", unitNS)
	}
	g := shell(t, ctx, sup, "cnivm")
	guestRun(t, ctx, g, "ip addr add "+n.Addrs[0]+" dev eth0 && ip link set eth0 up && ip route add default via "+n.Gateway)
	guestRun(t, ctx, g, "ping -c 1 -W 5 "+n.Gateway)
	hostPing(t, ctx, strings.Split(n.Addrs[0], "/")[0])

	// A second CNI NIC hot-plugged into the same namespace: ADD gives it
	// an address, the guest sees eth1 and reaches the gateway on it alone.
	hot, err := sup.AttachNIC(ctx, "cnivm", spec.NIC{Name: "pod2", Type: spec.NICCNI, CNIConfig: cniConf})
	if err != nil {
		t.Fatal(err)
	}
	st, _ = sup.Status(ctx, "cnivm")
	if len(st.NICs) != 2 || st.NICs[1].CNICheck != "ok" || len(st.NICs[1].Addrs) != 1 || leases(t) != 2 {
		t.Fatalf("after attach: NICs %+v, leases %d", st.NICs, leases(t))
	}
	a2 := st.NICs[1].Addrs[0]
	guestRun(t, ctx, g, "for i in $(seq 50); do test -e /sys/class/net/eth1 && break; sleep 0.2; done; grep -q "+hot.MAC+" /sys/class/net/eth1/address")
	guestRun(t, ctx, g, "ip link set eth0 down && ip addr add "+a2+" dev eth1 && ip link set eth1 up && ping -c 1 -W 5 "+n.Gateway)
	hostPing(t, ctx, strings.Split(a2, "/")[0])
	if err := sup.DetachNIC(ctx, "cnivm", "pod2"); err != nil {
		t.Fatal(err)
	}
	if leases(t) != 1 {
		t.Fatalf("%d leases after detach, want 1", leases(t))
	}
	if _, err := sup.Down(ctx, "cnivm"); err != nil {
		t.Fatal(err)
	}
	if leases(t) != 0 || slices.Contains(sandboxNetns(t), "vmsup-cnivm") {
		t.Fatalf("after down: leases %d, namespaces %v", leases(t), sandboxNetns(t))
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(st.StateDir)), "records", st.Name, "net.json")); !os.IsNotExist(err) {
		t.Fatalf("net.json left: %v", err)
	}
}
