package qmp

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// qemuProc is a QEMU started by a test, with no guest OS. Cleanup kills it
// by pid (never by name) and waits for it.
type qemuProc struct {
	cmd    *exec.Cmd
	sock   string
	exited chan struct{}
	stderr lockedBuffer
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// shortTempDir returns a temp dir whose path fits a unix socket address
// (108 bytes), which t.TempDir's may not for long test names.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startQEMU starts a paused (-S) TCG q35 QEMU with a QMP socket and waits
// until the socket exists.
func startQEMU(t *testing.T, extra ...string) *qemuProc {
	t.Helper()
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skipf("needs qemu-system-x86_64 in PATH: %v", err)
	}
	sock := filepath.Join(shortTempDir(t), "qmp.sock")
	args := append([]string{
		"-S", "-machine", "q35", "-accel", "tcg", "-nodefaults", "-no-user-config",
		"-display", "none", "-name", "vmsup-test",
		"-qmp", "unix:" + sock + ",server=on,wait=off",
	}, extra...)
	q := &qemuProc{cmd: exec.Command(bin, args...), sock: sock, exited: make(chan struct{})}
	q.cmd.Stderr = &q.stderr
	if err := q.cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	go func() {
		_ = q.cmd.Wait()
		close(q.exited)
	}()
	t.Cleanup(func() {
		_ = q.cmd.Process.Signal(syscall.SIGCONT) // a SIGSTOPped QEMU too
		_ = q.cmd.Process.Kill()
		<-q.exited
		if t.Failed() {
			t.Logf("qemu stderr: %s", q.stderr.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return q
		}
		select {
		case <-q.exited:
			t.Fatalf("qemu exited early: %s", q.stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("qemu socket %s did not appear: %s", sock, q.stderr.String())
		}
	}
}

func (q *qemuProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := q.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to qemu pid %d: %v", sig, q.cmd.Process.Pid, err)
	}
}

// dialQEMU connects to q and closes the connection when the test ends.
func dialQEMU(t *testing.T, q *qemuProc, opts ...Option) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// QEMU creates the socket file before it listens: retry refusals.
	c, err := Dial(ctx, q.sock, opts...)
	for errors.Is(err, syscall.ECONNREFUSED) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
		c, err = Dial(ctx, q.sock, opts...)
	}
	if err != nil {
		t.Fatalf("Dial: %v\nqemu stderr: %s", err, q.stderr.String())
	}
	t.Cleanup(func() { c.Close() })
	return c
}
