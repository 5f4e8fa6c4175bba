package netmanage_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/internal/net/nicfilter"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
	"github.com/vmsup/vmsup/units"
)

const staticIP = "10.77.0.50" // vmb's nic.ip

// vmFile is a test guest that asks for its address by DHCP (and waits
// for SLAAC's), with one NIC on the lab network and extra TOML after it.
func vmFile(t *testing.T, dir, name, nic, extra string) *spec.File {
	t.Helper()
	return vmFileOn(t, dir, name, labNet, "vmsup.dhcp vmsup.ipv6", nic, extra)
}

// vmFileOn is a test guest with the kernel command-line words given
// (scripts/build-guest.sh) and one NIC on network.
func vmFileOn(t *testing.T, dir, name, network, words, nic, extra string) *spec.File {
	t.Helper()
	body := fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
stop_timeout = "10s"
[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check %s"

[[nic]]
name = "lan"
type = "network"
network = %q
%s
%s`, name, env.Guest.Kernel, env.Guest.Initrd, words, network, nic, extra)
	return supervisortest.LoadTOML(t, dir, name, body)
}

// webGroup is vmb's security group: inbound denied but for ICMP and TCP
// port (both rules of both families: they name no network) and, with
// port6, TCP port6 from the lab's IPv6 prefix (IPv6 only).
func webGroup(port, port6 int) string {
	g := fmt.Sprintf(`
[[security_group]]
name = "web"
[[security_group.rule]]
direction = "in"
protocol = "tcp"
ports = "%d"
[[security_group.rule]]
direction = "in"
protocol = "icmp"
`, port)
	if port6 != 0 {
		g += fmt.Sprintf("[[security_group.rule]]\ndirection = \"in\"\nprotocol = \"tcp\"\nports = \"%d\"\ncidr = %q\n", port6, labPrefix6())
	}
	return g
}

// guest is one booted VM with its shell.
type guest struct {
	name, tap, mac, ip string
	ip6                string // its global IPv6 address (SLAAC)
	sh                 *testenv.GuestShell
}

func (g *guest) run(t *testing.T, ctx context.Context, cmd string) string {
	t.Helper()
	out, code, err := g.sh.Run(ctx, cmd)
	if err != nil || code != 0 {
		t.Fatalf("%s: %s: exit %d, %v\n%s", g.name, cmd, code, err, out)
	}
	return out
}

// TestManagedNetwork boots two guests on a dual-stack managed network
// (one with a static lease and a security group) and, sharing them, shows
// DHCP, DNS between them and NAT to another namespace, and the same for
// IPv6 (SLAAC and DHCPv6, AAAA names, NAT66); a spoofing guest dropped,
// over IPv4 and IPv6; a security group of both families and its live
// change; a NIC hot-plugged onto the network; a local migration there and
// back (the NIC on a tap of the new QEMU's, with its address, names and
// filter); and that nothing is left of a NIC after a killed QEMU and a
// down, nor of the network after rm.
func TestManagedNetwork(t *testing.T) {
	ctx := supervisortest.Context(t, 8*time.Minute)
	sup := supervisortest.New(t, env, "", vmsupBin)
	dir := t.TempDir()
	createNetwork(t, ctx, sup, dir)

	fa := vmFile(t, dir, "vma", "", "")
	fb := vmFile(t, dir, "vmb", `ip = "`+staticIP+`"`+"\nsecurity_groups = [\"web\"]", webGroup(8080, 0))
	t0 := time.Now()
	for _, f := range []*spec.File{fa, fb} {
		if _, err := sup.Up(ctx, f); err != nil {
			j, _ := env.Systemd.Journal(ctx, netmanage.DnsmasqUnit(labNet))
			t.Fatalf("%v\ndnsmasq's journal:\n%s", err, j)
		}
		t.Cleanup(func() { sup.Down(context.Background(), f.VM.Name) })
	}
	a, b := boot(t, ctx, sup, fa), boot(t, ctx, sup, fb)
	t.Logf("two guests with DHCP addresses %s and %s in %s", a.ip, b.ip, time.Since(t0).Round(time.Millisecond))

	t.Run("dhcp-dns", func(t *testing.T) {
		if b.ip != staticIP {
			t.Fatalf("vmb got %s by DHCP, want its static lease %s", b.ip, staticIP)
		}
		if out := a.run(t, ctx, "nslookup vmb"); !strings.Contains(out, staticIP) {
			t.Fatalf("vma: nslookup vmb:\n%s", out)
		}
		if out := b.run(t, ctx, "nslookup vma.lab"); !strings.Contains(out, a.ip) {
			t.Fatalf("vmb: nslookup vma.lab:\n%s", out)
		}
		a.run(t, ctx, "ping -c 1 -W 5 "+labGW)
	})
	t.Run("ls", func(t *testing.T) {
		lsShowsAddresses(t, ctx, sup, map[*guest]string{a: "/24 (eth0)", b: "/24 (eth0)"})
		a.run(t, ctx, "kill $(pidof qemu-ga)") // vma's agent answers no more
		lsShowsAddresses(t, ctx, sup, map[*guest]string{a: " (nic lan)", b: "/24 (eth0)"})
	})
	t.Run("nat", func(t *testing.T) {
		a.run(t, ctx, "ping -c 1 -W 5 "+outsideIP)
		if out := a.run(t, ctx, fmt.Sprintf("echo hi | nc -w 5 %s %d", outsideIP, outsidePort)); !strings.Contains(out, "outside") {
			t.Fatalf("vma: nc to the outside host: %q", out)
		}
		select {
		case from := <-seen:
			if from != uplinkHost {
				t.Fatalf("the outside host saw %s, want the uplink's %s (masqueraded)", from, uplinkHost)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the outside host saw no connection")
		}
	})
	t.Run("ipv6", func(t *testing.T) { ipv6Names(t, ctx, a, b) })
	t.Run("nat66", func(t *testing.T) { nat66(t, ctx, a) })
	t.Run("security-group", func(t *testing.T) { securityGroup(t, ctx, sup, dir, a, b) })
	t.Run("anti-spoofing-ipv6", func(t *testing.T) { antiSpoofing6(t, ctx, sup, a, b) })
	t.Run("anti-spoofing", func(t *testing.T) { antiSpoofing(t, ctx, sup, a, b) })
	t.Run("nic-attach", func(t *testing.T) { hotNIC(t, ctx, sup, b) })
	t.Run("migrate-local", func(t *testing.T) { migrateLocal(t, ctx, sup, a, b) })
	t.Run("rm-refused", func(t *testing.T) {
		out, err := cli(ctx, sup, "network", "rm", labNet)
		if err == nil || !strings.Contains(out, `network "lab" is used by VM vma, VM vmb`) {
			t.Fatalf("network rm with VMs on it: %v\n%s", err, out)
		}
		t.Logf("refused: %s", strings.TrimSpace(out))
	})
	t.Run("killed-qemu", func(t *testing.T) {
		pids, err := env.Systemd.HostPIDs("vmsup-vmb.service")
		if err != nil || len(pids) != 1 {
			t.Fatalf("QEMU pids %v %v", pids, err)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		supervisortest.WaitState(t, ctx, sup, "vmb", supervisor.StateCrashed, 30*time.Second)
		nothingLeft(t, ctx, sup, b)
	})
	t.Run("down", func(t *testing.T) {
		if _, err := sup.Down(ctx, "vma"); err != nil {
			t.Fatal(err)
		}
		nothingLeft(t, ctx, sup, a)
	})
	t.Run("rm", func(t *testing.T) { removeNetwork(t, ctx, sup) })
}

// lsShowsAddresses: vmsup ls shows each guest's addresses on the network,
// IPv4 and IPv6, followed by how, from its agent ("/24 (eth0)", "/64
// (eth0)") or, when the agent does not answer, from the host's lease and
// the SLAAC address it gave the NIC (" (nic lan)"; issue 47: the column
// was empty).
func lsShowsAddresses(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, want map[*guest]string) {
	// ls asks each agent within a short bound: on a loaded host an agent
	// may miss one, and ls then (rightly) shows the host's addresses.
	w := testenv.StartGuestWait("ls showing each guest's addresses as wanted", 20*time.Second)
	for {
		out, err := cli(ctx, sup, "ls")
		if err != nil {
			t.Fatalf("ls: %v\n%s", err, out)
		}
		bad := lsMismatch(out, want)
		if bad == "" {
			w.Done()
			t.Logf("ls:\n%s", out)
			return
		}
		if w.Expired() {
			t.Fatalf("%s (%s):\n%s", bad, w.Explain(), out)
		}
		time.Sleep(time.Second)
	}
}

// lsMismatch says which guest's addresses ls's output does not show as
// wanted ("" if all do).
func lsMismatch(out string, want map[*guest]string) string {
	rows := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = l
		}
	}
	for g, how := range want {
		how6 := strings.Replace(how, "/24", "/64", 1)
		if !strings.Contains(rows[g.name], " "+g.ip+how) || !strings.Contains(rows[g.name], " "+g.ip6+how6) {
			return fmt.Sprintf("ls does not show %s's addresses as %q and %q", g.name, g.ip+how, g.ip6+how6)
		}
	}
	return ""
}

// createNetwork defines the lab network through the CLI (after a
// definition with a bad field is refused, naming it).
func createNetwork(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, dir string) {
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("name = \"bad\"\nipv4 = \"10.77.0.0/33\"\n"), 0o644)
	if out, err := cli(ctx, sup, "network", "create", bad); err == nil || !strings.Contains(out, bad+": ipv4: ") {
		t.Fatalf("a bad definition: %v\n%s", err, out)
	}
	def := filepath.Join(dir, "lab.toml")
	// IPv6 by default (the ULA made from the name), here by both SLAAC
	// and DHCPv6.
	os.WriteFile(def, []byte(fmt.Sprintf("name = %q\nipv4 = %q\nuplink = %q\nipv6_mode = \"both\"\n", labNet, labGW+"/24", uplink)), 0o644)
	t0 := time.Now()
	if out, err := cli(ctx, sup, "network", "create", def); err != nil {
		j, _ := env.Systemd.Journal(ctx, netmanage.DnsmasqUnit(labNet))
		t.Fatalf("network create: %v\n%s\ndnsmasq's journal:\n%s", err, out, j)
	}
	t.Logf("network created (bridge, NAT, dnsmasq answering) in %s", time.Since(t0).Round(time.Millisecond))
	out, err := cli(ctx, sup, "network", "ls")
	if err != nil || !strings.Contains(out, "lab") || !strings.Contains(out, "active") || !strings.Contains(out, labGW6()+"/64 both nat6=true") {
		t.Fatalf("network ls: %v\n%s", err, out)
	}
}

// boot waits for the guest's DHCP address and shell.
func boot(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, f *spec.File) *guest {
	t.Helper()
	name := f.VM.Name
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitLog(t, st.ConsoleLog, testenv.NetReadyPrefix+"eth0 ", 3*time.Minute)
	sh := supervisortest.Shell(t, ctx, st)
	g := &guest{name: name, tap: f.VM.NICs[0].Tap, mac: f.VM.NICs[0].MAC, sh: sh}
	g.run(t, ctx, "dmesg -n 1")
	out := g.run(t, ctx, "ip -4 -o addr show dev eth0")
	fields := strings.Fields(out)
	for i, w := range fields {
		if w == "inet" && i+1 < len(fields) {
			g.ip, _, _ = strings.Cut(fields[i+1], "/")
		}
	}
	testenv.WaitLog(t, st.ConsoleLog, "VMSUP-NET6-READY eth0 ", time.Minute)
	fields = strings.Fields(g.run(t, ctx, "ip -6 -o addr show dev eth0 scope global"))
	for i, w := range fields {
		if w == "inet6" && i+1 < len(fields) {
			g.ip6, _, _ = strings.Cut(fields[i+1], "/")
		}
	}
	if len(st.NICs) != 1 || len(st.NICs[0].Addrs) != 2 || st.NICs[0].Addrs[0] != g.ip || st.NICs[0].Addrs[1] != g.ip6 {
		t.Fatalf("%s: guest has %q and %q; status says %+v", name, g.ip, g.ip6, st.NICs)
	}
	return g
}

// dial reports whether a TCP connection from the host to addr gets the
// guest's answer.
func dial(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.HasPrefix(line, "ok")
}

// securityGroup: vmb's group lets port 8080 in and not 8081, from the
// host and from vma, over IPv4 and IPv6 alike (its rules name no
// network); apply swaps them live and adds an IPv6-only rule for 9090,
// which IPv6 then reaches and IPv4 still does not.
func securityGroup(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, dir string, a, b *guest) {
	b.run(t, ctx, "(nc -ll -p 8080 -e echo ok8080 &); (nc -ll -p 8081 -e echo ok8081 &); (nc -ll -p 9090 -e echo ok9090 &); sleep 0.5")
	check := func(port int, v6, want bool) {
		t.Helper()
		ip := b.ip
		if v6 {
			ip = b.ip6
		}
		if got := dial(net.JoinHostPort(ip, fmt.Sprint(port))); got != want {
			t.Errorf("host -> vmb [%s]:%d: answered %v, want %v", ip, port, got, want)
		}
		out := a.run(t, ctx, fmt.Sprintf("nc -w 3 %s %d </dev/null; true", ip, port))
		if got := strings.Contains(out, fmt.Sprint("ok", port)); got != want {
			t.Errorf("vma -> vmb [%s]:%d: %q; answer wanted: %v", ip, port, out, want)
		}
	}
	expect := func(open, closed int, open9090 bool) {
		t.Helper()
		for _, v6 := range []bool{false, true} {
			check(open, v6, true)
			check(closed, v6, false)
		}
		check(9090, false, false)
		check(9090, true, open9090)
	}
	expect(8080, 8081, false)
	out, err := cli(ctx, sup, "status", "vmb")
	if err != nil || !strings.Contains(out, "network lab anti-spoofing true security-groups web dropped spoofed ") {
		t.Fatalf("vmsup status vmb: %v\n%s", err, out)
	}
	t.Logf("status: %s", grepLine(out, "nic:"))

	f2 := vmFile(t, filepath.Join(dir), "vmb", `ip = "`+staticIP+`"`+"\nsecurity_groups = [\"web\"]", webGroup(8081, 9090))
	// plan shows the groups as the file writes them (issue 47: a Go struct).
	out, err = cli(ctx, sup, "plan", f2.Path)
	want := fmt.Sprintf(`-> [{name = "web", rule = [{direction = "in", protocol = "tcp", ports = "8081"}, {direction = "in", protocol = "icmp"}, `+
		`{direction = "in", protocol = "tcp", ports = "9090", cidr = %q}]}]`, labPrefix6())
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("vmsup plan: %v\n%s", err, out)
	}
	t.Logf("plan: %s", grepLine(out, "live"))
	t0 := time.Now()
	res, err := sup.Apply(ctx, f2, supervisor.ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) != 1 || res.Applied[0].Field != "security_group" || res.Restarted || len(res.Pending) > 0 {
		t.Fatalf("apply: %+v", res)
	}
	t.Logf("apply changed the group live in %s", time.Since(t0).Round(time.Millisecond))
	expect(8081, 8080, true)
}

// antiSpoofing: vma sends as another address, as another MAC, answers
// ARP for others' addresses and serves DHCP; neither vmb (what its tap
// hands it) nor the host (what reaches the bridge) sees any of it, while
// vma's own traffic passes.
func antiSpoofing(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, a, b *guest) {
	toB, toHost := sniff(t, b.tap), sniff(t, "vmsn-"+labNet)
	aMAC, _ := net.ParseMAC(a.mac)
	fromA := func(bb []byte) bool { return slices.Equal(srcMAC(bb), aMAC) }
	ipIs := func(get func([]byte) net.IP, ip string) func([]byte) bool {
		return func(bb []byte) bool { x := get(bb); return x != nil && x.Equal(net.ParseIP(ip)) }
	}
	seen := func(what string, match func([]byte) bool) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		nb, nh := toB.count(true, match), toHost.count(false, match)
		if nb > 0 || nh > 0 {
			t.Errorf("%s: vmb got %d frames, the host %d; want none", what, nb, nh)
		}
	}
	// Control: vma's own traffic reaches both.
	a.run(t, ctx, "ping -c 1 -W 3 "+b.ip+" && ping -c 1 -W 3 "+labGW)
	time.Sleep(300 * time.Millisecond)
	if toB.count(true, ipIs(ipv4Src, a.ip)) == 0 || toHost.count(false, ipIs(ipv4Src, a.ip)) == 0 {
		t.Fatalf("the sniffers saw nothing of vma's own pings")
	}

	const other = "10.77.0.99"
	a.run(t, ctx, fmt.Sprintf("ip addr add %s/24 dev eth0 && arp -s %s %s && arp -s %s %s",
		other, b.ip, b.mac, labGW, hostMAC(t)))
	defer a.sh.Run(ctx, fmt.Sprintf("arp -d %s; arp -d %s", b.ip, labGW))
	a.sh.Run(ctx, fmt.Sprintf("ping -c 2 -W 1 -I %s %s; ping -c 2 -W 1 -I %s %s", other, b.ip, other, labGW))
	a.run(t, ctx, "ip addr del "+other+"/24 dev eth0")
	seen("another IP", func(bb []byte) bool { return ipIs(ipv4Src, other)(bb) || ipIs(arpSender, other)(bb) })

	const otherMAC = "52:54:00:de:ad:01"
	a.sh.Run(ctx, fmt.Sprintf("ip link set eth0 address %s && ping -c 2 -W 1 %s; ping -c 2 -W 1 %s", otherMAC, b.ip, labGW))
	a.run(t, ctx, "ip link set eth0 address "+a.mac)
	om, _ := net.ParseMAC(otherMAC)
	seen("another MAC", func(bb []byte) bool { return slices.Equal(srcMAC(bb), om) })

	a.sh.Run(ctx, fmt.Sprintf("arping -c 2 -A -I eth0 -s %s %s; arping -c 2 -U -I eth0 -s %s %s", labGW, labGW, b.ip, b.ip))
	seen("ARP for other addresses", func(bb []byte) bool {
		return fromA(bb) && (ipIs(arpSender, labGW)(bb) || ipIs(arpSender, b.ip)(bb))
	})

	a.run(t, ctx, "printf 'start 10.77.0.200\\nend 10.77.0.210\\ninterface eth0\\nlease_file /tmp/u.leases\\n' >/tmp/u.conf && udhcpd /tmp/u.conf")
	toB.reset()
	b.sh.Run(ctx, "udhcpc -i eth0 -n -q -t 3 -T 1 -s /bin/true")
	a.sh.Run(ctx, "killall udhcpd")
	seen("a DHCP server", func(bb []byte) bool { return fromA(bb) && udpSrcPort(bb) == 67 })
	if n := toB.count(true, func(bb []byte) bool { return udpSrcPort(bb) == 67 }); n == 0 {
		j, _ := env.Systemd.Journal(ctx, netmanage.DnsmasqUnit(labNet))
		t.Errorf("vmb got no DHCP reply at all (dnsmasq's should pass); dnsmasq's journal:\n%s", j)
	}
	a.run(t, ctx, "ping -c 1 -W 3 "+labGW) // vma is fine again

	st, err := sup.Status(ctx, "vma")
	if err != nil || st.NICs[0].Dropped == nil || st.NICs[0].Dropped.Spoofed == 0 {
		t.Fatalf("status of vma: %+v %v", st.NICs, err)
	}
	t.Logf("vma's anti-spoofing dropped %d packets", st.NICs[0].Dropped.Spoofed)
}

// migrateLocal: vmb (a static lease and the security group as apply left
// it: 8081 in, 8080 not) moves into a new QEMU on this host and back. Each
// time its NIC is on the new QEMU's tap, with the address, the name, the
// filter and the attachment, and the old tap and its filter are gone; the
// guest answers the host and vma as before; no lease was released.
func migrateLocal(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, a, b *guest) {
	own := b.tap
	dirs := filepath.Join(sup.Root(), "networks", labNet)
	for round, unit := range []string{"vmsup-vmb@migrated.service", "vmsup-vmb.service"} {
		old := b.tap
		t0 := time.Now()
		res, err := sup.Migrate(ctx, "vmb", supervisor.MigrateOptions{Local: true})
		if err != nil {
			t.Fatal(err)
		}
		st, err := sup.Status(ctx, "vmb")
		if err != nil || res.Unit != unit || st.Unit != unit || len(st.NICs) != 1 {
			t.Fatalf("round %d: migrate --local: %+v; status %+v %v", round, res, st, err)
		}
		n := st.NICs[0]
		t.Logf("round %d: vmb on tap %s (was %s) in %s, downtime %s", round, n.Tap, old, time.Since(t0).Round(time.Millisecond), res.Downtime)
		if n.Tap == old || (round == 1) != (n.Tap == own) || !n.TapUp || n.Bridge != "vmsn-"+labNet ||
			len(n.Addrs) == 0 || n.Addrs[0] != staticIP || !n.AntiSpoofing || !slices.Equal(n.SecurityGroups, []string{"web"}) {
			t.Fatalf("round %d: vmb's NIC after the move: %+v", round, n)
		}
		b.tap = n.Tap
		if netsetup.LinkExists(old) {
			t.Errorf("round %d: the old QEMU's tap %s is left", round, old)
		}
		tables := vmsupTables(t)
		for _, tb := range nicfilter.TableNames(old) {
			if slices.Contains(tables, tb) {
				t.Errorf("round %d: the old tap's table %s is left", round, tb)
			}
		}
		if !slices.Contains(tables, nicfilter.TableNames(b.tap)[0]) {
			t.Errorf("round %d: the new tap has no anti-spoofing table: %v", round, tables)
		}
		for _, sub := range []string{"nics/%s.json", "dhcp-hosts/%s", "dns-hosts/%s"} {
			if _, err := os.Stat(filepath.Join(dirs, fmt.Sprintf(sub, b.tap))); err != nil {
				t.Errorf("round %d: %v", round, err)
			}
			if _, err := os.Stat(filepath.Join(dirs, fmt.Sprintf(sub, old))); err == nil {
				t.Errorf("round %d: %s left", round, fmt.Sprintf(sub, old))
			}
		}
		// The guest's network answers: the host and vma reach it, its
		// group still holds, its name resolves; it reaches the gateway.
		b.sh.Close() // the old QEMU's console
		b.sh = supervisortest.Shell(t, ctx, st)
		b.run(t, ctx, "ping -c 1 -W 5 "+labGW)
		a.run(t, ctx, "ping -c 1 -W 5 "+b.ip)
		if !dial(b.ip+":8081") || dial(b.ip+":8080") {
			t.Errorf("round %d: host -> vmb: 8081 open %v, 8080 open %v; want open, blocked", round, dial(b.ip+":8081"), dial(b.ip+":8080"))
		}
		if out := a.run(t, ctx, "nslookup vmb"); !strings.Contains(out, staticIP) {
			t.Errorf("round %d: vma: nslookup vmb:\n%s", round, out)
		}
	}
	if j, _ := env.Systemd.Journal(ctx, netmanage.DnsmasqUnit(labNet)); strings.Contains(j, "DHCPRELEASE(vmsn-lab) "+staticIP) {
		t.Errorf("vmb's lease was released by a move; dnsmasq's journal:\n%s", j)
	}
}

// hostMAC is the lab bridge's MAC.
func hostMAC(t *testing.T) string {
	ifi, err := net.InterfaceByName("vmsn-" + labNet)
	if err != nil {
		t.Fatal(err)
	}
	return ifi.HardwareAddr.String()
}

// nothingLeft checks that g's NIC left nothing: tap, nftables tables,
// dnsmasq's lease and name, the attachment.
func nothingLeft(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, g *guest) {
	t.Helper()
	var tables []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		tables = vmsupTables(t)
		if !netsetup.LinkExists(g.tap) && !slices.ContainsFunc(tables, func(s string) bool { return strings.HasSuffix(s, g.tap) }) {
			break
		}
	}
	if netsetup.LinkExists(g.tap) {
		t.Errorf("tap %s left", g.tap)
	}
	for _, tb := range nicfilter.TableNames(g.tap) {
		if slices.Contains(tables, tb) {
			t.Errorf("nftables table %s left", tb)
		}
	}
	// dnsmasq drops the name when inotify tells it the file went.
	addrs, err := lookup(ctx, g.name)
	for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		addrs, err = lookup(ctx, g.name)
	}
	j, _ := env.Systemd.Journal(ctx, netmanage.DnsmasqUnit(labNet))
	if err == nil {
		t.Errorf("dnsmasq still resolves %s: %v; its journal:\n%s", g.name, addrs, j)
	}
	if !strings.Contains(j, fmt.Sprintf("DHCPRELEASE(vmsn-lab) %s %s", g.ip, g.mac)) {
		t.Errorf("dnsmasq did not release %s's lease; its journal:\n%s", g.name, j)
	}
	dirs := filepath.Join(sup.Root(), "networks", labNet)
	for _, sub := range []string{"nics/" + g.tap + ".json", "dhcp-hosts/" + g.tap, "dns-hosts/" + g.tap} {
		if _, err := os.Stat(filepath.Join(dirs, sub)); err == nil {
			t.Errorf("%s left", sub)
		}
	}
	out, err := cli(ctx, sup, "--json", "network", "ls")
	var infos []netmanage.Info
	if err != nil || json.Unmarshal([]byte(out), &infos) != nil || len(infos) != 1 {
		t.Fatalf("network ls --json: %v\n%s", err, out)
	}
	for _, n := range infos[0].NICs {
		if n.VM == g.name {
			t.Errorf("network ls still lists %s: %+v", g.name, n)
		}
	}
}

// removeNetwork: rm removes the bridge, the NAT table and dnsmasq.
func removeNetwork(t *testing.T, ctx context.Context, sup *supervisor.Supervisor) {
	if out, err := cli(ctx, sup, "network", "rm", labNet); err != nil {
		t.Fatalf("network rm: %v\n%s", err, out)
	}
	if netsetup.LinkExists("vmsn-" + labNet) {
		t.Error("bridge left")
	}
	if tl := vmsupTables(t); len(tl) > 0 {
		t.Errorf("nftables tables left: %v", tl)
	}
	sd, err := units.Connect(ctx, env.Systemd.BusAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	if st, err := sd.Status(ctx, netmanage.DnsmasqUnit(labNet)); err != nil || st.Exists {
		t.Errorf("dnsmasq unit left: %+v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(sup.Root(), "networks", labNet)); err == nil {
		t.Error("the network's directory left")
	}
}

func grepLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
