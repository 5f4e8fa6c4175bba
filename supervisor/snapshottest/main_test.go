package snapshottest

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// One systemd sandbox and one test guest for the package.
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-crash-helper" {
		os.Exit(crashHelper(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "-move-helper" {
		os.Exit(moveHelper(os.Args[2:]))
	}
	code := testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	})
	shared.Stop()
	os.Exit(code)
}

// shared is the Ceph cluster (and iSCSI target) the package starts when a
// test first needs it.
var shared supervisortest.Targets

// upVM writes body to dir/name.toml, loads it, and brings the VM up with a
// supervisor of its own on root ("" for a new one), brought down at
// cleanup: the supervisor, the loaded file and the VM's status.
func upVM(t *testing.T, ctx context.Context, root, dir, name, body string) (*supervisor.Supervisor, *spec.File, supervisor.Status) {
	t.Helper()
	sup := supervisortest.New(t, env, root, vmsupBin)
	f := supervisortest.UpTOML(t, ctx, sup, dir, name, body)
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return sup, f, st
}

// mark is a place in a console log: the file (the log is rotated when
// QEMU starts again) and the size it had.
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

// counters are the counter values the guest printed in log past m.
func counters(log string, m mark) []int {
	return supervisortest.CounterValues(since(log, m))
}

// waitCounter waits until the log past m shows a counter value above n
// and returns the values.
func waitCounter(t *testing.T, log string, m mark, n int, d time.Duration) []int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		c := counters(log, m)
		if len(c) > 0 && c[len(c)-1] > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no counter above %d within %s (values past the mark: %v)", log, n, d, c)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
