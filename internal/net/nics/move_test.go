package nics

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/spec"
)

func TestMain(m *testing.M) {
	// The move tests make bridges and taps: in a namespace of their own.
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestNextTap: a NIC's two taps take turns, each a valid link name.
func TestNextTap(t *testing.T) {
	own := "vmt0123456789a"
	next := NextTap(own, own)
	if next == own || len(next) > 15 || !strings.HasPrefix(next, "vmm") {
		t.Fatalf("NextTap(own, own) = %q", next)
	}
	if got := NextTap(own, next); got != own {
		t.Errorf("NextTap(own, next) = %q, want %q", got, own)
	}
	if NextTap(own, own) != next || NextTap("tap0", "tap0") == next {
		t.Errorf("NextTap is not a function of the NIC's own tap")
	}
}

// TestCanMove: a CNI NIC cannot have a second tap; bridge, OVS and
// managed network NICs can.
func TestCanMove(t *testing.T) {
	for typ, ok := range map[string]bool{spec.NICBridge: true, spec.NICOVS: true, spec.NICNetwork: true, spec.NICCNI: false} {
		err := CanMove(spec.NIC{Name: "n", Type: typ})
		if (err == nil) != ok {
			t.Errorf("CanMove(%s) = %v", typ, err)
		}
	}
}

// TestMoveTaps: a local migration's taps on a Linux bridge, from the
// record alone: the new QEMU's tap is made on the bridge and recorded as
// the next; the commit removes the old one and makes the next the NIC's;
// a second move takes the NIC's own name back, and an abort removes it
// again; a record left with two taps refuses a move and keeps both;
// teardown removes both.
func TestMoveTaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (bridges and taps, in a namespace of its own)")
	}
	ctx := context.Background()
	const bridge = "vmsmvbr0"
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(bridge); err == nil {
			netlink.LinkDel(l)
		}
	})
	no := false
	m := &Manager{Options: Options{VhostNet: &no}, Store: vmstore.Store{Root: t.TempDir()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	nic := spec.NIC{Name: "lan", Type: spec.NICBridge, Bridge: bridge, Tap: "vmtmvown0", MAC: "52:54:00:12:34:56"}
	f := &spec.File{VM: spec.VM{Name: "mv", NICs: []spec.NIC{nic}}}
	st := m.NewRecord("mv")
	if err := m.NICUp(ctx, "mv", nic, "", Owner{}, st); err != nil {
		t.Fatal(err)
	}
	onBridge := func(tap string) bool {
		br, _ := netsetup.LinkMaster(tap)
		return br == bridge
	}
	record := func() NICRecord {
		t.Helper()
		st, err := ReadRecord(m.Store.Paths("mv"))
		if err != nil || len(st.NICs) != 1 {
			t.Fatalf("record %+v %v", st, err)
		}
		return st.NICs[0]
	}

	taps, err := m.PrepareMove(ctx, "mv", f, Owner{})
	next := taps["lan"]
	if err != nil || next == "" || next == nic.Tap {
		t.Fatalf("PrepareMove = %v, %v", taps, err)
	}
	if r := record(); r.Tap != nic.Tap || r.Next != next || !onBridge(nic.Tap) || !onBridge(next) {
		t.Fatalf("after prepare: record %+v, %s on bridge %v, %s on bridge %v", r, nic.Tap, onBridge(nic.Tap), next, onBridge(next))
	}
	for range 2 { // idempotent
		if err := m.CommitMove(ctx, "mv"); err != nil {
			t.Fatal(err)
		}
	}
	if r := record(); r.Tap != next || r.Next != "" || netsetup.LinkExists(nic.Tap) || !onBridge(next) {
		t.Fatalf("after commit: record %+v, old tap there %v", r, netsetup.LinkExists(nic.Tap))
	}

	taps, err = m.PrepareMove(ctx, "mv", f, Owner{})
	if err != nil || taps["lan"] != nic.Tap || !onBridge(nic.Tap) {
		t.Fatalf("second PrepareMove = %v, %v (want the NIC's own %s back)", taps, err, nic.Tap)
	}
	if err := m.AbortMove(ctx, "mv"); err != nil {
		t.Fatal(err)
	}
	if r := record(); r.Tap != next || r.Next != "" || netsetup.LinkExists(nic.Tap) || !onBridge(next) {
		t.Fatalf("after abort: record %+v, the aborted tap there %v", r, netsetup.LinkExists(nic.Tap))
	}

	// Two taps left recorded (a settling that failed): refused, both kept.
	if _, err := m.PrepareMove(ctx, "mv", f, Owner{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.PrepareMove(ctx, "mv", f, Owner{}); err == nil || !strings.Contains(err.Error(), "left it two taps") {
		t.Fatalf("a move with two taps recorded: %v", err)
	}
	if !onBridge(nic.Tap) || !onBridge(next) {
		t.Fatal("a refused move removed a tap")
	}
	if err := m.Teardown(ctx, "mv", false); err != nil {
		t.Fatal(err)
	}
	if netsetup.LinkExists(nic.Tap) || netsetup.LinkExists(next) || m.HasRecord("mv") {
		t.Fatal("teardown left a tap or the record")
	}
}
