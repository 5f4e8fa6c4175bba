package guestagent

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/qmp"
)

// TestOnlineBlocks: a DIMM's blocks are found by its address in the
// guest's block size, those offline are asked for, those the guest does
// not list yet are waited for; the note names what was done and what the
// guest must do. (A real guest: supervisor's TestResizeOnlinesByAgent.)
func TestOnlineBlocks(t *testing.T) {
	var d1, d2 qmp.MemoryDevice
	d1.Data.Addr, d1.Data.Size = 4<<30, 256<<20
	d2.Data.Addr, d2.Data.Size = 4<<30+256<<20, 128<<20
	want := dimmBlocks([]qmp.MemoryDevice{d1, d2}, 128<<20)
	if !slices.Equal(want, []uint64{32, 33, 34}) {
		t.Fatalf("dimmBlocks = %v", want)
	}
	off, missing := offlineBlocks([]qmp.GuestMemoryBlock{{PhysIndex: 0, Online: true}, {PhysIndex: 32, Online: true}, {PhysIndex: 33}}, want)
	if missing != 1 || len(off) != 1 || off[0].PhysIndex != 33 || !off[0].Online {
		t.Errorf("offlineBlocks = %+v, %d missing", off, missing)
	}
	if n := (Onlined{}).note(nil); n != "" {
		t.Errorf("nothing to do: note %q", n)
	}
	n := Onlined{CPUs: 1, Memory: 128 << 20}.note([]string{"the guest sees 1 of 2 vCPUs after 30s"})
	if !strings.HasPrefix(n, "the guest agent onlined 1 vCPU(s) and 128M of memory; the guest sees 1 of 2 vCPUs") ||
		!strings.HasSuffix(n, guestMust) {
		t.Errorf("note %q", n)
	}
}
