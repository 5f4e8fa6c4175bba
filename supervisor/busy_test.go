package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// gate stops a command after its first step, while it holds the VM's lock,
// until released.
type gate struct {
	mu      sync.Mutex
	armed   bool
	reached chan string
	release chan struct{}
}

func (g *gate) arm() {
	g.mu.Lock()
	g.armed, g.reached, g.release = true, make(chan string, 1), make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) afterStep(_, step string) {
	g.mu.Lock()
	armed := g.armed
	g.armed = false
	g.mu.Unlock()
	if armed {
		g.reached <- step
		<-g.release
	}
}

// TestOneOperationAtATime: each command that changes a VM (apply, disk
// move, snapshot, backup, disk hot-plug, local migration, reboot), held
// after its first step, keeps every other one out: each is refused as busy
// (naming the one at work) and does nothing; the held one then finishes.
func TestOneOperationAtATime(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	root, dir := t.TempDir(), t.TempDir()
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	g := &gate{}
	held, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps, AllowPaths: env.AllowPaths,
		JournalDir: env.Systemd.JournalDir, Self: vmsupBin, AfterStep: g.afterStep})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	other := newSup(t, root)
	const vm = "busy"
	path := filepath.Join(dir, vm+".toml")
	write := func(desc string) *spec.File {
		writeGuestTOML(t, path, vm, fmt.Sprintf("description = %q\n[[disk]]\nname = \"data\"\nfile = %q\nsize = \"16M\"\n",
			desc, filepath.Join(images, "data.qcow2")))
		f, err := spec.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if _, err := other.Up(ctx, write("v0")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Kill(context.Background(), vm) })
	st, _ := other.Status(ctx, vm)
	supervisortest.Shell(t, ctx, st).Close()
	hot, err := spec.CheckDisk("--file", spec.Disk{Name: "hot", File: filepath.Join(images, "hot.qcow2"), Size: 8 * spec.MiB}, vm)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ops := []struct {
		name  string
		run   func(*supervisor.Supervisor) error
		reset func()
	}{
		{"apply", func(s *supervisor.Supervisor) error {
			_, err := s.Apply(ctx, write(fmt.Sprintf("v%d", n)), supervisor.ApplyOptions{})
			return err
		}, nil},
		{"disk-move", func(s *supervisor.Supervisor) error {
			_, err := s.MoveDisk(ctx, vm, "data", supervisor.MoveOptions{To: filepath.Join(images, fmt.Sprintf("data-%d.qcow2", n))})
			return err
		}, nil},
		{"snapshot", func(s *supervisor.Supervisor) error {
			_, err := s.Snapshot(ctx, vm, fmt.Sprintf("s%d", n), supervisor.SnapshotOptions{})
			return err
		}, func() {
			if err := other.RemoveSnapshot(ctx, vm, fmt.Sprintf("s%d", n), nil); err != nil {
				t.Fatal(err)
			}
		}},
		{"backup", func(s *supervisor.Supervisor) error {
			_, err := s.Backup(ctx, vm, supervisor.BackupOptions{Dir: filepath.Join(dir, fmt.Sprintf("backup-%d", n))})
			return err
		}, nil},
		{"disk-attach", func(s *supervisor.Supervisor) error { _, err := s.AttachDisk(ctx, vm, *hot); return err }, func() {
			if err := other.DetachDisk(ctx, vm, "hot"); err != nil {
				t.Fatal(err)
			}
		}},
		{"migrate-local", func(s *supervisor.Supervisor) error {
			_, err := s.Migrate(ctx, vm, supervisor.MigrateOptions{Local: true})
			return err
		}, nil},
		{"reboot", func(s *supervisor.Supervisor) error { _, err := s.Reboot(ctx, vm, supervisor.RebootACPI); return err }, nil},
	}
	for _, x := range ops {
		n++
		g.arm()
		done := make(chan error, 1)
		go func() { done <- x.run(held) }()
		var step string
		select {
		case step = <-g.reached:
		case err := <-done:
			t.Fatalf("%s ended (%v) before it took a step", x.name, err)
		}
		for _, y := range ops {
			err := y.run(other)
			var busy *supervisor.BusyError
			if !errors.As(err, &busy) || !strings.Contains(err.Error(), "busy: ") {
				t.Errorf("%s while %s is at work (after its step %q): %v, want busy", y.name, x.name, step, err)
			}
		}
		close(g.release)
		if err := <-done; err != nil {
			t.Fatalf("%s, held and let go: %v", x.name, err)
		}
		if x.reset != nil {
			x.reset()
		}
		t.Logf("%s held after %q: every command (a second of its own too) was refused as busy, then it finished", x.name, step)
	}
}
