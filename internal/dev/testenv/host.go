package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/host/caps"
)

// QEMUBinary is the QEMU the tests run: VMSUP_TEST_QEMU (a stand-in such
// as scripts/testing/qemu-abort-host, which aborts on -cpu host under KVM
// as an AMD host with PVM KVM does) or the installed one.
func QEMUBinary() string {
	if q := os.Getenv("VMSUP_TEST_QEMU"); q != "" {
		return q
	}
	return "/usr/bin/qemu-system-x86_64"
}

// probeHost probes this host's QEMU and KVM once for the Env, and keeps
// the record in dir for the vmsup processes tests run (VMSUP_HOST_CACHE).
func probeHost(ctx context.Context, dir string) (*caps.Caps, string, error) {
	cache := filepath.Join(dir, "hostcaps.json")
	c, err := caps.Probe(ctx, caps.Options{QEMU: QEMUBinary(), CacheFile: cache})
	return c, cache, err
}

// KVMSkip skips t unless QEMU starts under KVM here, printing the probe's
// reason.
func (e *Env) KVMSkip(t testing.TB) {
	t.Helper()
	if ok, why := e.Caps.KVM.Starts(); !ok {
		t.Skipf("QEMU does not start under KVM here (host probe: %s)", why)
	}
}

// CLIEnv is the environment a vmsup process run by a test gets so that it
// uses the test QEMU, the Env's host probe record and its host places.
func (e *Env) CLIEnv() []string {
	return []string{"VMSUP_QEMU=" + e.QEMU, "VMSUP_HOST_CACHE=" + e.CapsCache,
		"VMSUP_ALLOW_PATHS=" + strings.Join(e.AllowPaths, ":"), "VMSUP_BLOCK_DIRS=" + strings.Join(e.BlockDirs, ":")}
}
