package realguesttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestRealGuest boots the real Debian guest once, on the managed network,
// and runs the day-2 verbs against it in order (see the package doc).
func TestRealGuest(t *testing.T) {
	skipUnlessImage(t)
	ctx := supervisortest.Context(t, 45*time.Minute)
	sup := newSup(t)
	dir := t.TempDir()
	g := &realGuest{sup: sup, name: vmName, dir: dir, key: sshKey(t, dir)}
	createNetwork(t, ctx, sup, dir)
	f := g.writeFile(t, dataSize)
	g.file = f.Path
	t0 := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.DownWith(context.Background(), vmName, supervisor.DownOptions{Force: true}) })
	st, err := sup.Status(ctx, vmName)
	if err != nil {
		t.Fatal(err)
	}
	g.console = st.ConsoleLog
	g.waitBoot(t, ctx, bootTimeout)
	t.Logf("up to the boot marker and the agent in %s", time.Since(t0).Round(100*time.Millisecond))

	steps := []struct {
		name string
		run  func(*testing.T, context.Context, *realGuest)
	}{
		{"cloud-init-seed", testSeed},
		{"agent-exec-cp", testAgent},
		{"dhcp-dns-ssh", testSSH},
		{"disk-hotplug", testDiskHotplug},
		{"nic-hotplug", testNICHotplug},
		{"disk-grow-by-apply", testDiskGrow},
		{"snapshot-fsfreeze", testSnapshot},
		{"backup-restore", testBackup},
		{"reboot-agent", func(t *testing.T, ctx context.Context, g *realGuest) { testReboot(t, ctx, g, supervisor.RebootAgent) }},
		{"reboot-acpi", func(t *testing.T, ctx context.Context, g *realGuest) { testReboot(t, ctx, g, supervisor.RebootACPI) }},
		{"migrate-local", testMigrateLocal},
		{"cpu-memory-hotplug", testHotplugCPUMemory},
		{"down-clean", testDown},
		{"restored-backup-boots", testRestoredBoots},
	}
	for _, s := range steps {
		t1 := time.Now()
		t.Run(s.name, func(t *testing.T) { s.run(t, ctx, g) })
		t.Logf("%s: %s", s.name, time.Since(t1).Round(100*time.Millisecond))
	}
}

// testSeed: what vmsup's seed asked cloud-init for is in the guest.
func testSeed(t *testing.T, ctx context.Context, g *realGuest) {
	if h := g.sh(t, ctx, "hostname"); h != seedHost {
		t.Errorf("hostname %q, want the seed's %q", h, seedHost)
	}
	if m := g.sh(t, ctx, "cat "+markerPath); m != markerText {
		t.Errorf("%s: %q, want %q", markerPath, m, markerText)
	}
	pub, _ := os.ReadFile(g.key + ".pub")
	keys := g.sh(t, ctx, "getent passwd "+seedUser+" && cat /home/"+seedUser+"/.ssh/authorized_keys")
	if !strings.Contains(keys, strings.TrimSpace(string(pub))) {
		t.Errorf("user %s or its key missing:\n%s", seedUser, keys)
	}
	status := g.sh(t, ctx, "cloud-init status --long")
	if !strings.Contains(status, "status: done") || !strings.Contains(status, "DataSourceNoCloud") {
		t.Errorf("cloud-init status:\n%s", status)
	}
	t.Logf("cloud-init: %s", strings.ReplaceAll(status, "\n", "; "))
	t.Logf("the boot (TCG, load %.1f per CPU): %s\n%s", testenv.Slowness(), g.sh(t, ctx, "systemd-analyze time | head -n 1"),
		g.sh(t, ctx, "systemd-analyze blame --no-pager | head -n 8"))
}

// testAgent: exec returns the guest command's output and exit code (API
// and CLI); cp carries a file both ways unchanged.
func testAgent(t *testing.T, ctx context.Context, g *realGuest) {
	r, err := g.sup.Exec(ctx, vmName, []string{"/bin/sh", "-c", "cat /etc/debian_version; echo oops >&2; exit 3"}, testenv.GuestBound(time.Minute))
	if err != nil || r.ExitCode != 3 || !strings.HasPrefix(string(r.Stdout), "12.") || string(r.Stderr) != "oops\n" {
		t.Errorf("exec: %+v %v", r, err)
	}
	out, err := cli(ctx, g.sup, "exec", vmName, "--", "sh", "-c", "uname -r; exit 7")
	if code := exitCode(err); code != 7 || !strings.Contains(out, "-amd64") {
		t.Errorf("vmsup exec: exit %d, %q", code, out)
	}
	data := make([]byte, 300<<10)
	rand.Read(data)
	if n, err := g.sup.CopyToGuest(ctx, vmName, bytes.NewReader(data), "/root/vmsup-cp.bin", supervisor.CopyOptions{}); err != nil || n != int64(len(data)) {
		t.Fatalf("cp to the guest: %d %v", n, err)
	}
	g.sh(t, ctx, "test $(stat -c %s /root/vmsup-cp.bin) = 307200")
	var back bytes.Buffer
	if n, err := g.sup.CopyFromGuest(ctx, vmName, "/root/vmsup-cp.bin", &back, supervisor.CopyOptions{}); err != nil || n != int64(len(data)) {
		t.Fatalf("cp from the guest: %d %v", n, err)
	}
	if !bytes.Equal(back.Bytes(), data) {
		t.Error("cp: the file came back changed")
	}
}

// ipv4 is the one IPv4 address among addrs ("" if none or several).
func ipv4(addrs []string) string {
	var v4 []string
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil && ip.To4() != nil {
			v4 = append(v4, a)
		}
	}
	if len(v4) != 1 {
		return ""
	}
	return v4[0]
}

func exitCode(err error) int {
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// testSSH: the guest took its address from the network's DHCP (the one
// status names), the network's DNS resolves the VM's name to it, and the
// seed's user logs in over ssh with the seed's key.
func testSSH(t *testing.T, ctx context.Context, g *realGuest) {
	st, err := g.sup.Status(ctx, vmName)
	if err != nil || len(st.NICs) != 1 {
		t.Fatalf("status: %+v %v", st.NICs, err)
	}
	w := testenv.StartGuestWait("the real guest's DHCP address", time.Minute)
	for ; g.ip == ""; time.Sleep(time.Second) {
		out := g.sh(t, ctx, "ip -4 -o addr show scope global")
		if f := strings.Fields(out); len(f) > 3 && f[2] == "inet" {
			g.ip, _, _ = strings.Cut(f[3], "/")
		}
		if g.ip == "" && w.Expired() {
			t.Fatalf("no IPv4 address in the guest: %s\n%s", w.Explain(), out)
		}
	}
	if ipv4(st.NICs[0].Addrs) != g.ip {
		t.Errorf("guest has %s; status says %+v", g.ip, st.NICs[0])
	}
	if lease := g.sh(t, ctx, "cat /var/lib/dhcp/dhclient.*.leases 2>/dev/null || true"); !strings.Contains(lease, g.ip) {
		t.Errorf("no DHCP lease for %s in the guest:\n%s", g.ip, lease)
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", labGW+":53")
	}}
	// The network is dual-stack: the name has the NIC's IPv6 address too.
	if addrs, err := r.LookupHost(ctx, vmName+"."+labNet); err != nil || ipv4(addrs) != g.ip {
		t.Errorf("DNS %s.%s: %v %v, want %s", vmName, labNet, addrs, err, g.ip)
	}
	if out := g.sh(t, ctx, "getent ahostsv4 "+vmName+"."+labNet+" || true"); !strings.Contains(out, g.ip) {
		t.Errorf("the guest resolves %s.%s to %q, want %s", vmName, labNet, out, g.ip)
	}
	t0 := time.Now()
	out, err := g.ssh(ctx, "hostname; cat "+markerPath+"; sudo -n true && echo sudo-ok")
	if err != nil || out != seedHost+"\n"+markerText+"\nsudo-ok" {
		t.Fatalf("ssh %s@%s: %v\n%s", seedUser, g.ip, err, out)
	}
	t.Logf("ssh %s@%s (%s.%s) answered in %s", seedUser, g.ip, vmName, labNet, time.Since(t0).Round(100*time.Millisecond))
}

// testDiskHotplug: a hot-plugged disk is named by udev under
// /dev/disk/by-id with its serial, at its size; gone after the detach.
func testDiskHotplug(t *testing.T, ctx context.Context, g *realGuest) {
	// In the state root's image directory: the only place a running VM
	// can open a new image.
	file := filepath.Join(g.sup.Root(), "images", "hot.qcow2")
	d, err := spec.CheckDisk("test", spec.Disk{Name: "hot", File: file, Size: 32 << 20, Serial: "vmsup-hot"}, vmName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.sup.AttachDisk(ctx, vmName, *d); err != nil {
		t.Fatal(err)
	}
	dev := g.byID(t, ctx, d.Serial)
	if dev == "" {
		t.Fatalf("no /dev/disk/by-id/virtio-%s in the guest:\n%s", d.Serial, g.sh(t, ctx, "ls -l /dev/disk/by-id; lsblk"))
	}
	if size := g.sh(t, ctx, "lsblk -bdno SIZE "+dev); size != "33554432" {
		t.Errorf("%s: %s bytes, want 32 MiB", dev, size)
	}
	props := g.sh(t, ctx, "udevadm info --query=property "+dev)
	if !strings.Contains(props, "ID_SERIAL=vmsup-hot") {
		t.Errorf("udev's properties of %s:\n%s", dev, props)
	}
	t.Logf("hot-plugged disk: %s", dev)
	if err := g.sup.DetachDisk(ctx, vmName, d.Name); err != nil {
		t.Fatal(err)
	}
	w := testenv.StartGuestWait("udev removes a disk's by-id link", 30*time.Second)
	for {
		if _, code := g.shCode(t, ctx, "test -e /dev/disk/by-id/virtio-"+d.Serial); code != 0 {
			break
		}
		if w.Expired() {
			t.Fatalf("/dev/disk/by-id/virtio-%s still there after the detach: %s", d.Serial, w.Explain())
		}
		time.Sleep(time.Second)
	}
}

// testDiskGrow: apply of a file with a larger data disk grows it live
// (plan says so first) and the guest's kernel sees the new size.
func testDiskGrow(t *testing.T, ctx context.Context, g *realGuest) {
	growData(t, ctx, g, grownSize)
}

// growData writes the VM file with the data disk at size, plans and
// applies it, and waits for the guest to see the size.
func growData(t *testing.T, ctx context.Context, g *realGuest, size string) {
	t.Helper()
	dev := g.byID(t, ctx, dataSerial)
	if dev == "" {
		t.Fatalf("no data disk in the guest:\n%s", g.sh(t, ctx, "ls -l /dev/disk/by-id"))
	}
	f := g.writeFile(t, size)
	p, err := g.sup.Plan(ctx, f)
	if err != nil || len(p.Changes) == 0 {
		t.Fatalf("plan: %+v %v", p, err)
	}
	for _, c := range p.Changes {
		if c.Class != plan.Live {
			t.Fatalf("plan: %+v is not live", c)
		}
		t.Logf("plan: %+v", c)
	}
	if _, err := g.sup.Apply(ctx, f, supervisor.ApplyOptions{}); err != nil {
		t.Fatalf("apply (data %s): %v", size, err)
	}
	want, err := spec.ParseSize(size)
	if err != nil {
		t.Fatal(err)
	}
	w := testenv.StartGuestWait("the guest sees a disk grow", 30*time.Second)
	for {
		got := g.sh(t, ctx, "blockdev --getsize64 "+dev)
		if got == strconv.FormatInt(int64(want), 10) {
			break
		}
		if w.Expired() {
			t.Fatalf("%s: %s bytes in the guest, want %d: %s", dev, got, int64(want), w.Explain())
		}
		time.Sleep(time.Second)
	}
	t.Logf("the guest's %s grew to %s: %s", dev, size, g.sh(t, ctx, "journalctl --no-pager -b -k -o cat | grep 'capacity change' | tail -n 1"))
}

// testNICHotplug: a NIC hot-plugged onto the managed network through the
// CLI appears in the guest, named by udev, and takes the address status
// names from the network's DHCP; gone after the detach.
func testNICHotplug(t *testing.T, ctx context.Context, g *realGuest) {
	if out, err := cli(ctx, g.sup, "nic", "attach", vmName, "lan2", "--type", "network", "--network", labNet); err != nil {
		t.Fatalf("vmsup nic attach --type network: %v\n%s", err, out)
	}
	detached := false
	t.Cleanup(func() { // a hot-plugged NIC left behind stops migrate --local
		if !detached {
			g.sup.DetachNIC(context.Background(), vmName, "lan2")
		}
	})
	st, err := g.sup.Status(ctx, vmName)
	if err != nil || len(st.NICs) != 2 || ipv4(st.NICs[1].Addrs) == "" {
		t.Fatalf("status after the attach: %+v %v", st.NICs, err)
	}
	mac, addr := st.NICs[1].MAC, ipv4(st.NICs[1].Addrs)
	// After udev has renamed it (the kernel's ethN first, then its
	// predictable name): settle once the device is there, then look.
	find := `for i in /sys/class/net/*; do [ "$(cat $i/address)" = "` + mac + `" ] && udevadm settle -t 10 && break; done; ` +
		`for i in /sys/class/net/*; do [ "$(cat $i/address)" = "` + mac + `" ] && basename $i; done; true`
	var ifname string
	w := testenv.StartGuestWait("udev names a hot-plugged NIC", 30*time.Second)
	for ; ifname == "" && !w.Expired(); time.Sleep(time.Second) {
		ifname = g.sh(t, ctx, find)
	}
	if ifname == "" {
		t.Fatalf("no interface with MAC %s in the guest:\n%s", mac, g.sh(t, ctx, "ip -o link"))
	}
	if props := g.sh(t, ctx, "udevadm info --query=property /sys/class/net/"+ifname); !strings.Contains(props, "ID_NET_NAME_PATH=") {
		t.Errorf("udev's properties of %s:\n%s", ifname, props)
	}
	dh := "-pf /run/vmsup-dh.pid -lf /run/vmsup-dh.leases " + ifname
	g.sh(t, ctx, "dhclient -1 "+dh)
	if got := g.sh(t, ctx, "ip -4 -o addr show dev "+ifname); !strings.Contains(got, " "+addr+"/") {
		t.Errorf("%s (mac %s) has %q by DHCP, status says %s", ifname, mac, got, addr)
	}
	t.Logf("hot-plugged NIC: %s, mac %s, %s by DHCP", ifname, mac, addr)
	g.sh(t, ctx, "dhclient -r "+dh)
	if out, err := cli(ctx, g.sup, "nic", "detach", vmName, "lan2"); err != nil {
		t.Fatalf("vmsup nic detach: %v\n%s", err, out)
	}
	detached = true
	if _, code := g.shCode(t, ctx, "test -e /sys/class/net/"+ifname); code == 0 {
		t.Errorf("%s still in the guest after the detach", ifname)
	}
}
