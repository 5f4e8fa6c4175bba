package nicfilter

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/testenv"
	"github.com/vmsup/vmsup/spec"
)

func TestMain(m *testing.M) {
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestApplyReplaceRemove loads a tap's filter into the kernel, reads it
// back with nft (what an operator sees), replaces it and removes it.
func TestApplyReplaceRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (nftables in a network namespace of the test's own)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft (Debian package nftables) not installed: scripts/install-deps.sh installs it")
	}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	f := Filter{Tap: "vmtabc", MAC: mac, IP: net.ParseIP("10.77.0.5"), AntiSpoofing: true,
		Groups: []spec.SecurityGroup{{Name: "web", Rules: []spec.SecurityRule{
			{Direction: "in", Protocol: "tcp", Ports: "8080", CIDR: "10.77.0.0/24"},
			{Direction: "in", Protocol: "udp", Ports: "5000-5010", Action: "deny"},
		}}}}
	if err := Apply(f); err != nil {
		t.Fatal(err)
	}
	out := nft(t, "list", "ruleset")
	for _, want := range []string{
		`table bridge vmsup-as-vmtabc`, `iifname "vmtabc" jump guard`, `ether saddr != 52:54:00:12:34:56 counter`,
		`ether type arp jump arp`, `@nh,112,32 0xa4d0005 accept`, // the ARP sender address
		`udp sport 67 counter`, `@nh,96,32 0xa4d0005 accept`, // the IPv4 source
		`table inet vmsup-sg-vmtabc`, `ip daddr 10.77.0.5 jump to-guest`, `ct state established,related accept`,
		`ip saddr 10.77.0.0/24 tcp dport 8080 accept`, `udp dport 5000-5010 counter`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, out)
		}
	}
	// Replace: no groups, anti-spoofing kept.
	f.Groups = nil
	if err := Apply(f); err != nil {
		t.Fatal(err)
	}
	if tl, _ := ListTables(); len(tl) != 1 || tl[0] != "bridge vmsup-as-vmtabc" {
		t.Fatalf("tables after replace: %v", tl)
	}
	if n, err := Read("vmtabc"); err != nil || n.Tables != 1 {
		t.Fatalf("counters %+v %v", n, err)
	}
	for range 2 { // idempotent
		if err := Remove("vmtabc"); err != nil {
			t.Fatal(err)
		}
	}
	if out := nft(t, "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Fatalf("left after remove:\n%s", out)
	}
	if err := Apply(Filter{Tap: "x", MAC: mac}); err == nil {
		t.Fatal("a filter without an address was accepted")
	}
}

func nft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("nft", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v\n%s", args, err, out)
	}
	return string(out)
}
