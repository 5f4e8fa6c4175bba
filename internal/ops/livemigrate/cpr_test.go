package livemigrate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// TestDecideMode: a local migration of a VM whose RAM is shared hands it
// over in place where this host's QEMU has cpr-transfer; anything else
// copies it, and a local one says why in one line.
func TestDecideMode(t *testing.T) {
	shared, private := &qemuargs.RAM{ID: qemuargs.DefaultRAMID, Shared: true}, &qemuargs.RAM{ID: qemuargs.DefaultRAMID}
	q10 := func() (bool, string) { return true, "" }
	q72 := func() (bool, string) { return false, "QEMU 7.2.22 has no cpr-transfer migration mode" }
	local := migwire.Options{Local: true}
	plain, huge := &spec.VM{}, &spec.VM{Hugepages: spec.Hugepages2M}
	for _, c := range []struct {
		name string
		o    migwire.Options
		vm   *spec.VM
		ram  *qemuargs.RAM
		host func() (bool, string)
		cpr  bool
		why  string
	}{
		{"shared, QEMU 10", local, plain, shared, q10, true, ""},
		{"across hosts", migwire.Options{To: "b"}, plain, shared, q10, false, ""},
		{"no-cpr", migwire.Options{Local: true, NoCPR: true}, plain, shared, q10, false, "no-cpr"},
		{"postcopy", migwire.Options{Local: true, Postcopy: true}, plain, shared, q10, false, "postcopy"},
		{"multifd", migwire.Options{Local: true, Multifd: 2}, plain, shared, q10, false, "multifd"},
		{"QEMU 7.2", local, plain, private, q72, false, "QEMU 7.2.22 has no cpr-transfer"},
		{"not shared", local, plain, private, q10, false, "started without a shared memory backend"},
		{"no record", local, plain, nil, q10, false, "started without a shared memory backend"},
		{"hugepages", local, huge, private, q10, false, "hugepages"},
		{"sev", local, &spec.VM{SEV: &spec.SEV{}}, private, q10, false, "SEV"},
		{"private by its file", local, &spec.VM{SharedMemory: new(bool)}, private, q10, false, "shared_memory = false"},
	} {
		cpr, why := decideMode(c.o, c.vm, c.ram, c.host)
		if cpr != c.cpr || (c.why == "") != (why == "") || !strings.Contains(why, c.why) || strings.Contains(why, "\n") {
			t.Errorf("%s: %v %q, want %v %q", c.name, cpr, why, c.cpr, c.why)
		}
	}
	if modeParam(true, shared) != "cpr-transfer" || modeParam(false, shared) != "normal" || modeParam(false, private) != "" || modeParam(false, nil) != "" {
		t.Error("modeParam: a QEMU without modes (no shared RAM) gets none; one with them is set back to normal")
	}
}

// TestWaitingForCPR: a destination with a cpr channel and no monitor yet
// has no guest; one with a monitor, or none of either, may.
func TestWaitingForCPR(t *testing.T) {
	dir := t.TempDir()
	qmpSock := filepath.Join(dir, "qmp.sock")
	if waitingForCPR(qmpSock) {
		t.Fatal("nothing there: not a cpr destination")
	}
	if err := os.WriteFile(filepath.Join(dir, "cpr.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !waitingForCPR(qmpSock) {
		t.Fatal("cpr channel, no monitor: waiting")
	}
	if err := os.WriteFile(qmpSock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if waitingForCPR(qmpSock) {
		t.Fatal("a monitor: not waiting any more")
	}
}
