package memstate

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// qemuVersion is the major.minor a QEMU binary reports ("7.2").
func qemuVersion(t *testing.T, bin string, env []string) string {
	t.Helper()
	cmd := exec.Command(bin, "--version")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("%s --version: %v", bin, err)
	}
	m := regexp.MustCompile(`version (\d+\.\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("%s --version: %q", bin, out)
	}
	return string(m[1])
}

// qemu10 is QEMU 10 from scripts/install-qemu10.sh's prefix, run in place
// beside the installed 7.2: its own data (-L) and modules (TCG is one in
// Debian's QEMU), not 7.2's at the compiled-in paths.
func qemu10(t *testing.T) qemuCmd {
	t.Helper()
	p := os.Getenv("VMSUP_QEMU10")
	if p == "" {
		p = "/opt/vmsup/qemu10"
	}
	q := qemuCmd{bin: filepath.Join(p, "root/usr/bin/qemu-system-x86_64"), machine: "pc-q35-7.2",
		env:  []string{"QEMU_MODULE_DIR=" + filepath.Join(p, "root/usr/lib/x86_64-linux-gnu/qemu")},
		args: []string{"-L", filepath.Join(p, "share-qemu")}}
	if _, err := os.Stat(q.bin); err != nil {
		t.Skipf("no QEMU 10 in %s (scripts/install-qemu10.sh puts it there): %v", p, err)
	}
	if v := qemuVersion(t, q.bin, q.env); v[:3] != "10." {
		t.Skipf("%s is QEMU %s, not 10", q.bin, v)
	}
	return q
}

// TestLoad72StateIn10: a memory state QEMU 7.2 wrote (a plain "fd:"
// stream) loads into QEMU 10 through vmsup's Load, which there goes
// through "file:" with mapped-ram off because the state's header says it
// was written without: a memory snapshot taken before an upgrade reverts
// after it. Both run the machine version the state names (pc-q35-7.2):
// QEMU 10's "q35" is pc-q35-10.0, which refuses it. Runs in the pass on
// the installed 7.2 (the QEMU 10 pass has no 7.2 to write with).
func TestLoad72StateIn10(t *testing.T) {
	old := qemuCmd{bin: testenv.QEMUBinary(), machine: "pc-q35-7.2"}
	if v := qemuVersion(t, old.bin, nil); v != "7.2" {
		t.Skipf("the installed QEMU is %s: this test loads a state QEMU 7.2 wrote (the pass on 7.2 runs it)", v)
	}
	q10 := qemu10(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	src, _ := startIn(t, ctx, old)
	state := filepath.Join(t.TempDir(), "vm72.state")
	save(t, ctx, state, func(f *os.File) error { return Save(ctx, src, f, nil) })
	h, err := ReadHeader(mustOpen(t, state))
	if err != nil || h.Machine != "pc-q35-7.2" || h.MappedRAM() {
		t.Fatalf("7.2's state header %+v %v: want pc-q35-7.2, no mapped-ram", h, err)
	}

	dst, dstErr := startIn(t, ctx, q10, "-incoming", "defer")
	if way, err := Ask(ctx, dst); err != nil || !way.File {
		t.Fatalf("QEMU 10's way %+v %v: want file:", way, err)
	}
	if err := Load(ctx, dst, mustOpen(t, state)); err != nil {
		t.Fatalf("load 7.2's state into QEMU 10: %v (%s)", err, dstErr.String())
	}
	qs, err := dst.QueryStatus(ctx)
	if err != nil || qs.Running || qs.Status == "inmigrate" {
		t.Fatalf("after the load: %+v %v, want the source's stopped state", qs, err)
	}
	checkReset(t, ctx, dst)
}
