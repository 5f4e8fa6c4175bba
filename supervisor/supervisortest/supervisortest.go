// Package supervisortest has what the tests that drive a Supervisor share,
// as net/http/httptest does for handlers: a Supervisor wired to a testenv
// sandbox, a VM file that boots the test guest, waits on a VM's state and
// console, and the guest's shell; the counter guest (counter.go), two
// "hosts" for cross-host migrations (hosts.go), and the fault machinery
// that kills a command mid-way and checks what it left (fault.go,
// settle.go, hotvm.go), which the supervisor package and its fault suite
// (supervisor/faulttest) both use. It is for tests only: it fails them
// through testing.TB.
package supervisortest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// New returns a Supervisor with its own state root (a temporary one when
// root is ""), wired to the sandbox of e; self is the vmsup binary its
// units call back into. It is closed when the test ends.
func New(t testing.TB, e *testenv.Env, root, self string) *supervisor.Supervisor {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	s, err := supervisor.New(supervisor.Options{
		Root:       root,
		SystemdBus: e.Systemd.BusAddress, QEMU: e.QEMU, HostCaps: e.Caps,
		JournalDir: e.Systemd.JournalDir,
		Self:       self,
		AllowPaths: e.AllowPaths, BlockDirs: e.BlockDirs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// WriteGuestTOML writes a VM file booting the test guest under TCG (256
// MiB, 2 hotplug slots, a 20 s stop_timeout unless extra sets one); extra
// holds more top-level keys and tables.
func WriteGuestTOML(t testing.TB, e *testenv.Env, path, name, extra string) {
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
cmdline = "console=ttyS0 no_timer_check"
`, name, extra, e.Guest.Kernel, e.Guest.Initrd)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// GuestFile writes DIR/NAME.toml (WriteGuestTOML) and parses it.
func GuestFile(t testing.TB, e *testenv.Env, dir, name, extra string) *spec.File {
	t.Helper()
	path := filepath.Join(dir, name+".toml")
	WriteGuestTOML(t, e, path, name, extra)
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// WaitState polls Status until the VM reaches want: systemd settles a
// killed unit asynchronously (its stop-post hook runs first), so one look
// may still see "stopping".
func WaitState(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, name string, want supervisor.State, d time.Duration) supervisor.Status {
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

// Context is a context that ends with the test, or after d on a quiet
// host: scaled to the host's load (testenv.GuestBound), though the scaling
// never takes it past the test binary's own deadline less a minute, so
// that a test that runs out of time fails with its own message.
func Context(t testing.TB, d time.Duration) context.Context {
	scaled := testenv.GuestBound(d)
	if td, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := td.Deadline(); ok {
			scaled = max(min(scaled, time.Until(end)-time.Minute), d)
		}
	}
	d = scaled
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Shell waits for the guest's shell marker on the VM's console log and
// dials its console; the shell is closed when the test ends.
func Shell(t testing.TB, ctx context.Context, st supervisor.Status) *testenv.GuestShell {
	t.Helper()
	testenv.WaitLog(t, st.ConsoleLog, testenv.ShellMarker, 3*time.Minute)
	sh, err := testenv.DialConsole(ctx, st.Console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	return sh
}

// InOrder reports whether want is a subsequence of got.
func InOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// Tail is the last n bytes of s, for failure messages.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// LoadTOML writes body as DIR/NAME.toml and loads it (spec.Load: parsed and
// validated).
func LoadTOML(t testing.TB, dir, name, body string) *spec.File {
	t.Helper()
	path := filepath.Join(dir, name+".toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// UpTOML loads body (LoadTOML) and brings its VM up with sup; the VM goes
// down when the test ends.
func UpTOML(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, dir, name, body string) *spec.File {
	t.Helper()
	f := LoadTOML(t, dir, name, body)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), name) })
	return f
}

// StopByUnit stops VM vm's unit with `systemctl stop`, as a host shutdown
// does, and fails t unless its stop hooks ran and succeeded (stopHooksRan)
// and the ExecStop= hook powered the guest off by ACPI.
func StopByUnit(t testing.TB, ctx context.Context, sd *testenv.Systemd, vm string) {
	t.Helper()
	unit := "vmsup-" + vm + ".service"
	before, _ := sd.Journal(ctx, unit)
	if out, err := sd.Systemctl(ctx, "stop", unit); err != nil {
		t.Fatalf("systemctl stop %s: %v\n%s", unit, err, out)
	}
	if j := stopHooksRan(t, ctx, sd, vm, before); !strings.Contains(j, supervisor.HookStop+" "+vm+": acpi") {
		t.Fatalf("%s: systemctl stop did not power the guest off by ACPI; journal:\n%s", unit, Tail(j, 3000))
	}
}

// DownByACPI is `vmsup down` of vm, failing t unless the guest powered
// off by ACPI and the unit's stop hooks still ran and succeeded after it
// (stopHooksRan).
func DownByACPI(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, sd *testenv.Systemd, vm string) {
	t.Helper()
	before, _ := sd.Journal(ctx, "vmsup-"+vm+".service")
	r, err := sup.Down(ctx, vm)
	if err != nil || r.Step != supervisor.StoppedACPI {
		t.Fatalf("down %s: %+v %v (want the guest's own ACPI power-off)", vm, r, err)
	}
	stopHooksRan(t, ctx, sd, vm, before)
}

// stopHooksRan waits for the ExecStopPost= hook's line in vm's unit journal
// after before (the journal's text until the stop) and fails t if a spawn
// of the unit failed setting up its namespace (a bind path the unit names
// that an operation deleted: 226/NAMESPACE). It returns the new journal.
func stopHooksRan(t testing.TB, ctx context.Context, sd *testenv.Systemd, vm, before string) string {
	t.Helper()
	unit := "vmsup-" + vm + ".service"
	w := testenv.StartGuestWait("the stop-post hook's line in the journal", 10*time.Second)
	for {
		all, _ := sd.Journal(ctx, unit)
		j := strings.TrimPrefix(all, before)
		if strings.Contains(j, "226/NAMESPACE") || strings.Contains(j, "at step NAMESPACE") {
			t.Fatalf("%s: a spawn of the unit failed setting up its namespace (a path it names is gone):\n%s", unit, Tail(j, 3000))
		}
		if strings.Contains(j, supervisor.HookPost+" "+vm+":") {
			w.Done()
			return j
		}
		if w.Expired() {
			t.Fatalf("%s: no line of the stop-post hook after the stop: %s; journal:\n%s", unit, w.Explain(), Tail(j, 3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
