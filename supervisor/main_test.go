package supervisor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// env is the one systemd sandbox and test guest this package shares; vmsupBin
// is the CLI the units call for their graceful stop hook.
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-crash-helper" {
		os.Exit(crashHelper(os.Args[2:]))
	}
	// apply's kills run it in a child: this binary again
	// (supervisortest.RunJob).
	if len(os.Args) > 2 && os.Args[1] == "-fault-helper" {
		os.Exit(supervisortest.FaultHelper(os.Args[2]))
	}
	// A network namespace of its own: the full-filesystem test's bridge and
	// taps and the cross-host tests' veths stay out of the host's.
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	code := testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	})
	targets.Stop() // tgt and Ceph, if a storage test started them
	os.Exit(code)
}

// Helpers shared with the other packages that drive a Supervisor
// (supervisortest), under the names these tests use.
func newSup(t testing.TB, root string) *supervisor.Supervisor {
	t.Helper()
	return supervisortest.New(t, env, root, vmsupBin)
}

func guestFile(t testing.TB, dir, name, extra string) *spec.File {
	t.Helper()
	return supervisortest.GuestFile(t, env, dir, name, extra)
}

func writeGuestTOML(t testing.TB, path, name, extra string) {
	t.Helper()
	supervisortest.WriteGuestTOML(t, env, path, name, extra)
}

func waitState(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, name string, want supervisor.State, d time.Duration) supervisor.Status {
	t.Helper()
	return supervisortest.WaitState(t, ctx, sup, name, want, d)
}

func ctxT(t testing.TB, d time.Duration) context.Context { return supervisortest.Context(t, d) }

func tail(s string, n int) string { return supervisortest.Tail(s, n) }

// refusedFile writes a spec that passes validation but that QEMU refuses at
// start: its kernel is a file that is not a kernel.
func refusedFile(t testing.TB, dir, name, extra string) *spec.File {
	t.Helper()
	path := filepath.Join(dir, name+".toml")
	writeGuestTOML(t, path, name, extra)
	bogus := filepath.Join(dir, name+".notakernel")
	if err := os.WriteFile(bogus, []byte("not a kernel\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), env.Guest.Kernel, bogus, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// waitConsole waits until the VM's console log contains marker.
func waitConsole(t testing.TB, st supervisor.Status, marker string, d time.Duration) {
	t.Helper()
	testenv.WaitLog(t, st.ConsoleLog, marker, d)
}

// qemuPIDs returns the host PIDs in the VM's unit.
func qemuPIDs(t testing.TB, name string) []int {
	t.Helper()
	pids, err := env.Systemd.HostPIDs("vmsup-" + name + ".service")
	if err != nil {
		return nil
	}
	return pids
}
