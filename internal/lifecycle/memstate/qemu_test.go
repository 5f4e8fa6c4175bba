package memstate

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/qmp"
)

// startQEMU starts a small stopped q35 VM (TCG, no guest) in this host's
// QEMU with its monitor on a socket (descriptors pass only over a socket
// monitor), plus args.
func startQEMU(t *testing.T, ctx context.Context, args ...string) (*qmp.Conn, *bytes.Buffer) {
	t.Helper()
	return startIn(t, ctx, qemuCmd{bin: testenv.QEMUBinary(), machine: "q35"}, args...)
}

// qemuCmd is a QEMU binary, its environment and the machine it starts.
type qemuCmd struct {
	bin     string
	env     []string // added to this process's
	machine string
	args    []string // before the caller's
}

func startIn(t *testing.T, ctx context.Context, q qemuCmd, args ...string) (*qmp.Conn, *bytes.Buffer) {
	t.Helper()
	if _, err := os.Stat(q.bin); err != nil {
		t.Skipf("no QEMU: %v", err)
	}
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	all := append([]string{"-nodefaults", "-no-user-config", "-display", "none", "-S", "-machine", q.machine, "-accel", "tcg",
		"-m", "64", "-qmp", "unix:" + sock + ",server=on,wait=off"}, q.args...)
	all = append(all, args...)
	cmd := exec.Command(q.bin, all...)
	cmd.Env = append(os.Environ(), q.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := qmp.Dial(ctx, sock)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c, &stderr
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU's monitor: %v (%s)", err, stderr.String())
		}
	}
}

// TestSaveLoadInQEMU saves a VM's state the way this QEMU takes it, loads
// it into a second QEMU, and checks that nothing is left set up: on QEMU
// 7.2 through "fd:", on QEMU 10 through "file:" with mapped-ram (and no
// deprecation warning). It then loads a plain stream (as QEMU 7.2 or an
// "fd:" save writes) the same way, as a host upgraded from 7.2 does.
func TestSaveLoadInQEMU(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src, srcErr := startQEMU(t, ctx)
	way, err := Ask(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("this QEMU's way: %+v", way)
	state := filepath.Join(t.TempDir(), "vm.state")
	save(t, ctx, state, func(f *os.File) error { return Save(ctx, src, f, nil) })
	h, err := ReadHeader(mustOpen(t, state))
	if err != nil || h.MappedRAM() != way.MappedRAM {
		t.Fatalf("header %+v %v: want mapped-ram %v", h, err, way.MappedRAM)
	}
	checkReset(t, ctx, src)
	if strings.Contains(srcErr.String(), "deprecated") {
		t.Errorf("QEMU warned: %s", srcErr.String())
	}
	load(t, ctx, state)

	// A plain stream, written through "fd:" as before.
	plain := filepath.Join(t.TempDir(), "plain.state")
	src2, _ := startQEMU(t, ctx)
	save(t, ctx, plain, func(f *os.File) error {
		if err := src2.GetFD(ctx, fdName, f); err != nil {
			return err
		}
		if err := src2.Migrate(ctx, "fd:"+fdName); err != nil {
			return err
		}
		return Wait(ctx, src2, nil)
	})
	if h, err := ReadHeader(mustOpen(t, plain)); err != nil || h.MappedRAM() {
		t.Fatalf("plain stream's header %+v %v", h, err)
	}
	load(t, ctx, plain)
}

func save(t *testing.T, ctx context.Context, path string, do func(*os.File) error) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := do(f); err != nil {
		t.Fatalf("save: %v", err)
	}
}

func load(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	dst, dstErr := startQEMU(t, ctx, "-incoming", "defer")
	if err := Load(ctx, dst, mustOpen(t, path)); err != nil {
		t.Fatalf("load %s: %v (%s)", filepath.Base(path), err, dstErr.String())
	}
	qs, err := dst.QueryStatus(ctx)
	// The source never ran (-S): the state says prelaunch, not inmigrate.
	if err != nil || qs.Running || qs.Status == "inmigrate" {
		t.Fatalf("after the load: %+v %v, want the source's stopped state", qs, err)
	}
	checkReset(t, ctx, dst)
}

// checkReset: mapped-ram is off and no fd set of a state file is left.
func checkReset(t *testing.T, ctx context.Context, c *qmp.Conn) {
	t.Helper()
	caps, err := capabilities(ctx, c)
	if err != nil || caps[MappedRAM] {
		t.Errorf("mapped-ram left on (%v)", err)
	}
	sets, err := c.QueryFDSets(ctx)
	if err != nil || len(sets) != 0 {
		t.Errorf("fd sets left: %+v %v", sets, err)
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
