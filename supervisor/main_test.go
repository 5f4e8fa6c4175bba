package supervisor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
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
	if len(os.Args) > 2 && os.Args[1] == "-fault-helper" {
		os.Exit(faultHelper(os.Args[2]))
	}
	// A network namespace of its own: the fault suite's bridge and taps
	// stay out of the host's.
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	code := testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	})
	stopTargets() // tgt and Ceph, if a storage test started them
	os.Exit(code)
}

// newSup returns a Supervisor with its own state root, wired to the sandbox.
func newSup(t testing.TB, root string) *supervisor.Supervisor {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	s, err := supervisor.New(supervisor.Options{
		Root:       root,
		SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps,
		JournalDir: env.Systemd.JournalDir,
		Self:       vmsupBin,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// guestFile writes a VM spec booting the test guest and parses it.
func guestFile(t testing.TB, dir, name, extra string) *spec.File {
	t.Helper()
	path := filepath.Join(dir, name+".toml")
	writeGuestTOML(t, path, name, extra)
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func writeGuestTOML(t testing.TB, path, name, extra string) {
	t.Helper()
	if !strings.Contains(extra, "stop_timeout") {
		extra = "stop_timeout = \"20s\"\n" + extra
	}
	body := fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
hotplug_slots = 2
%s
[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0"
`, name, extra, env.Guest.Kernel, env.Guest.Initrd)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

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

// waitState polls Status until the VM reaches want: systemd settles a killed
// unit asynchronously (its stop-post hook runs first), so one look may still
// see "stopping".
func waitState(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, name string, want supervisor.State, d time.Duration) supervisor.Status {
	t.Helper()
	var st supervisor.Status
	var err error
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		st, err = sup.Status(ctx, name)
		if err == nil && st.State == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("vm %s: not %s within %s: %+v %v", name, want, d, st, err)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
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
