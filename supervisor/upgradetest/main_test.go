package upgradetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// One systemd sandbox and test guest for the package, and the vmsup CLI.
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	// Mounts (QEMU 10 over 7.2) and links (the cross-host veths) stay in
	// namespaces of the test binary's own.
	if code, ok := testenv.InPrivateMountNetns(); ok {
		os.Exit(code)
	}
	if why := testenv.QEMU10Missing(); why != "" {
		fmt.Println("upgradetest:", why, "- no sandbox started; the tests skip")
		os.Exit(m.Run())
	}
	os.Exit(testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	}))
}

// newSup is a supervisor on root that probes its host itself (not the
// Env's fixed record), as every vmsup command does: its cache starts as
// the Env's record of the installed QEMU, which a host has from before an
// upgrade. root is made if missing.
func newSup(t testing.TB, root string) *supervisor.Supervisor {
	t.Helper()
	cache := filepath.Join(root, "cache", "hostcaps.json")
	if _, err := os.Stat(cache); os.IsNotExist(err) {
		b, err := os.ReadFile(env.CapsCache)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cache, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU,
		JournalDir: env.Systemd.JournalDir, Self: vmsupBin, AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// cli runs `vmsup --json ARGS` on root, in the test's mount namespace (its
// QEMU, its probe), and returns its last JSON line decoded into out.
func cli(t testing.TB, ctx context.Context, root string, out any, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, vmsupBin, append([]string{"--json"}, args...)...)
	cmd.Env = append(os.Environ(), "VMSUP_ROOT="+root, "VMSUP_SYSTEMD_BUS="+env.Systemd.BusAddress,
		"VMSUP_JOURNAL_DIR="+env.Systemd.JournalDir, "VMSUP_QEMU="+env.QEMU,
		"VMSUP_ALLOW_PATHS="+strings.Join(env.AllowPaths, ":"), "VMSUP_BLOCK_DIRS="+strings.Join(env.BlockDirs, ":"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("vmsup %s: %v\n%s%s", strings.Join(args, " "), err, b, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), out); err != nil {
		t.Fatalf("vmsup %s: %v: %s", strings.Join(args, " "), err, b)
	}
}

// guestBody is a counter guest (TCG) with one 64 MiB qcow2 data disk
// (/dev/vda) at disk, which vmsup makes.
func guestBody(name, disk, extra string) string {
	return fmt.Sprintf(`name = %q
memory = "192M"
accel = "tcg"
stop_timeout = "20s"
%s
[[disk]]
name = "data"
file = %q
size = "64M"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.counter"
`, name, extra, disk, env.Guest.Kernel, env.Guest.Initrd)
}

const mib = 1 << 20

// guestWrite writes 1 MiB of word ("WORD\n" repeated) at MiB off of the
// data disk, synced.
func guestWrite(t testing.TB, ctx context.Context, st supervisor.Status, word string, off int) {
	t.Helper()
	supervisortest.GuestExec(t, ctx, st.Console, fmt.Sprintf(
		"yes %s | head -c %d | dd of=/dev/vda bs=65536 seek=%d conv=notrunc 2>/dev/null && sync", word, mib, off*16))
}

// guestRead is what the data disk holds at MiB off (its first 8 bytes,
// NULs dropped), read past the guest's page cache.
func guestRead(t testing.TB, ctx context.Context, st supervisor.Status, off int) string {
	t.Helper()
	out := supervisortest.GuestExec(t, ctx, st.Console, fmt.Sprintf(
		"dmesg -n 1; echo 3 > /proc/sys/vm/drop_caches; printf 'DATA[%%s]\\n' \"$(dd if=/dev/vda bs=1M skip=%d count=1 2>/dev/null | head -c 16 | head -n 1 | tr -d '\\000')\"", off))
	m := regexp.MustCompile(`DATA\[([^\]]*)\]`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no DATA[...] in %q", out)
	}
	return m[1]
}

// qemuRun is what runs a VM: its QEMU process (host PID, binary), the
// version its monitor reports and the machine type its command line names.
type qemuRun struct {
	PID     int
	Exe     os.FileInfo
	Version string // "10.0.2"
	Machine string // "pc-q35-7.2"
}

// runningQEMU looks at the one QEMU in VM name's unit.
func runningQEMU(t testing.TB, ctx context.Context, sd *testenv.Systemd, sup *supervisor.Supervisor, name string) qemuRun {
	t.Helper()
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := sd.HostPIDs(st.Unit)
	if err != nil || len(pids) != 1 {
		t.Fatalf("vm %s: unit %s has QEMU pids %v (%v)", name, st.Unit, pids, err)
	}
	r := qemuRun{PID: pids[0]}
	if r.Exe, err = os.Stat(fmt.Sprintf("/proc/%d/exe", r.PID)); err != nil {
		t.Fatal(err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.PID))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(string(cmdline), "\x00")
	for i, a := range args {
		if a == "-machine" && i+1 < len(args) {
			r.Machine, _, _ = strings.Cut(args[i+1], ",")
		}
	}
	b, err := sup.QMP(ctx, name, []byte(`{"execute":"query-version"}`), false)
	if err != nil {
		t.Fatalf("vm %s: query-version: %v", name, err)
	}
	var v struct {
		Return struct {
			QEMU struct{ Major, Minor, Micro int } `json:"qemu"`
		} `json:"return"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("vm %s: query-version: %v: %s", name, err, b)
	}
	q := v.Return.QEMU
	r.Version = fmt.Sprintf("%d.%d.%d", q.Major, q.Minor, q.Micro)
	return r
}

// expectQEMU fails unless r runs binary (as a file: the same inode, under
// whatever is bound over its path now), at a version starting major., on
// machine type machine.
func expectQEMU(t testing.TB, what string, r qemuRun, binary os.FileInfo, major, machine string) {
	t.Helper()
	if !os.SameFile(r.Exe, binary) || !strings.HasPrefix(r.Version, major+".") || r.Machine != machine {
		t.Fatalf("%s: QEMU pid %d runs %s (the wanted binary: %v), version %s, machine %q; want %s.x on %s",
			what, r.PID, r.Exe.Name(), os.SameFile(r.Exe, binary), r.Version, r.Machine, major, machine)
	}
	t.Logf("%s: QEMU %s (pid %d) on %s", what, r.Version, r.PID, r.Machine)
}

// stat is os.Stat, failing t.
func stat(t testing.TB, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// putQEMU10 puts QEMU 10 in place in the mount namespace of pid; undone
// when the test ends if undo is set (a VM unit's namespace goes with it).
func putQEMU10(t testing.TB, ctx context.Context, pid int, undo bool) {
	t.Helper()
	u, err := testenv.PutQEMU10(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	if undo {
		t.Cleanup(func() {
			if err := u(context.Background()); err != nil {
				t.Errorf("take QEMU 10 away again: %v", err)
			}
		})
	}
}

// elapsed logs how long a step took, for the figures the package adds.
func elapsed(t testing.TB, what string, t0 time.Time) {
	t.Logf("%s: %s", what, time.Since(t0).Round(100*time.Millisecond))
}

// mark is a place in a console log: the file (a new QEMU starts a new
// one) and the size it had.
type mark struct {
	ino  uint64
	size int
}

func markOf(path string) mark {
	fi, err := os.Stat(path)
	if err != nil {
		return mark{}
	}
	return mark{ino: fi.Sys().(*syscall.Stat_t).Ino, size: int(fi.Size())}
}

// since is what the log holds past m (all of a file that replaced it).
func since(path string, m mark) string {
	b, _ := os.ReadFile(path)
	if markOf(path).ino != m.ino || m.size > len(b) {
		return string(b)
	}
	return string(b[m.size:])
}

// waitCounterSince waits for k counter values in the log past m and
// returns them.
func waitCounterSince(t testing.TB, log string, m mark, k int) []int {
	t.Helper()
	w := testenv.StartGuestWait(fmt.Sprintf("%d counter values", k), time.Minute)
	for {
		c := supervisortest.CounterValues(since(log, m))
		if len(c) >= k {
			w.Done()
			return c
		}
		if w.Expired() {
			t.Fatalf("%s: %s (values past the mark: %v)", log, w.Explain(), c)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
