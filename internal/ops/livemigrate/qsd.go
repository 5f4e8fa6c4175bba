package livemigrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/qemuargs"
)

// A move of a shut-off VM (move_out.go, move_in.go) has no QEMU to copy
// its disks: each side runs a qemu-storage-daemon, QEMU's block layer
// without a guest, as a child of its vmsup (killed with it: Pdeathsig).
// The source's opens the disks read-only and takes the same QMP commands
// as a running VM's QEMU (the nbd nodes and blockdev-mirror of
// storage_out.go); the destination's exports the copies it made over NBD,
// as a destination QEMU does (storage_in.go).

// storageDaemon is a running qemu-storage-daemon.
type storageDaemon struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once it exited
	err    error         // its exit, once done
	stderr *tailBuffer
}

// storageDaemonBin is qemu-storage-daemon beside the QEMU binary vmsup
// runs, else on PATH.
func storageDaemonBin(qemu string) (string, error) {
	if qemu != "" {
		if p := filepath.Join(filepath.Dir(qemu), "qemu-storage-daemon"); exists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("qemu-storage-daemon")
	if err != nil {
		return "", errors.New("moving a shut-off VM's disks needs qemu-storage-daemon on both hosts (Debian: qemu-system-common)")
	}
	return p, nil
}

// startStorageDaemon runs bin with args and waits until sock is there (its
// monitor or its NBD server listens).
func startStorageDaemon(ctx context.Context, bin string, args []string, sock string) (*storageDaemon, error) {
	d := &storageDaemon{done: make(chan struct{}), stderr: &tailBuffer{max: 4 << 10}}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig follows the thread that forked, not the process: the
		// thread stays, locked, until the daemon exits.
		runtime.LockOSThread()
		d.cmd = exec.Command(bin, args...)
		d.cmd.Stderr, d.cmd.Stdout = d.stderr, d.stderr
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := d.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("qemu-storage-daemon: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	for !exists(sock) {
		select {
		case <-d.done:
			return nil, fmt.Errorf("qemu-storage-daemon exited (%v): %s", d.err, d.stderr.String())
		case <-ctx.Done():
			d.stop()
			return nil, fmt.Errorf("qemu-storage-daemon did not open %s within %s", sock, prepareTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return d, nil
}

// stop ends the daemon: SIGTERM (it flushes and closes its images), then
// SIGKILL if it lingers. nil when it exited cleanly.
func (d *storageDaemon) stop() error {
	if d == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(killTimeout):
		_ = d.cmd.Process.Kill()
		<-d.done
		return errors.New("qemu-storage-daemon did not exit on SIGTERM; killed")
	}
	var ee *exec.ExitError
	if errors.As(d.err, &ee) && !ee.Exited() { // the signal we sent
		return nil
	}
	if d.err != nil {
		return fmt.Errorf("qemu-storage-daemon: %w: %s", d.err, d.stderr.String())
	}
	return nil
}

// blockdevArgs are the --blockdev options of disk c's image, file then
// format node (the format node named as in the VM's QEMU), read-only on
// the source.
func blockdevArgs(c migwire.DiskCopy, readOnly bool) []string {
	file := "file-" + strings.TrimPrefix(qemuargs.DiskNodeName(c.Name), "fmt-")
	return []string{
		"--blockdev", jsonArg(map[string]any{"driver": "file", "node-name": file, "filename": c.File, "read-only": readOnly}),
		"--blockdev", jsonArg(map[string]any{"driver": c.Format, "node-name": qemuargs.DiskNodeName(c.Name), "file": file, "read-only": readOnly}),
	}
}

// jsonArg is an option of qemu-storage-daemon in its JSON form (any path
// as is: no comma escaping).
func jsonArg(v map[string]any) string {
	b, _ := json.Marshal(v) // maps of strings and bools
	return string(b)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// removeFiles removes files, those already gone aside.
func removeFiles(files []string) error {
	var errs []error
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
