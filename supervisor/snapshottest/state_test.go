package snapshottest

import (
	"os"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/memstate"
)

// checkStateWay: a memory snapshot's state file was written with mapped-ram
// where the host probe found QEMU has it (QEMU 10 under with-qemu10: only
// "file:" takes mapped-ram, so the save went through file:, not the
// deprecated fd:), and as a plain stream on QEMU 7.2.
func checkStateWay(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := memstate.ReadHeader(f)
	if err != nil {
		t.Fatalf("memory state %s: %v", path, err)
	}
	want := env.Caps.HasMigrationCap(memstate.MappedRAM)
	if h.MappedRAM() != want {
		t.Fatalf("memory state of QEMU %s (machine %s, capabilities %v): mapped-ram %v, want %v",
			env.Caps.QEMU.Version, h.Machine, h.Capabilities, h.MappedRAM(), want)
	}
	t.Logf("memory state of QEMU %s: machine %s, mapped-ram %v", env.Caps.QEMU.Version, h.Machine, h.MappedRAM())
}
