package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// crashHelper runs in a child process: Up, killing itself with SIGKILL right
// after the named step, as if vmsup died there.
func crashHelper(args []string) int {
	root, bus, self, file, killAfter := args[0], args[1], args[2], args[3], args[4]
	sup, err := supervisor.New(supervisor.Options{
		Root: root, SystemdBus: bus, Self: self, AllowPaths: testenv.AllowPaths(), BlockDirs: testenv.BlockDirs(),
		AfterStep: func(_, step string) {
			if step == killAfter {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		},
	})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	f, err := spec.Load(file)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	if _, err := sup.Up(context.Background(), f); err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

// TestKilledBetweenSteps: vmsup dies after each step of up; the next command
// sees the true state (running or not), never a half-made VM, and the next
// up and down work.
func TestKilledBetweenSteps(t *testing.T) {
	ctx := ctxT(t, 4*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	// The guest need not boot: down ends by quit after 1 s.
	f := guestFile(t, t.TempDir(), "killed", "stop_timeout = \"1s\"")
	steps := sup.StartSteps(f, supervisor.StartFresh) // the real list, host steps included
	t.Logf("up's steps: %v", steps)
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", root, env.Systemd.BusAddress, vmsupBin, f.Path, step)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("helper did not die after %s: %v\n%s", step, err, out)
			}
			pids := qemuPIDs(t, "killed")
			st, err := sup.Status(ctx, "killed")
			switch {
			case len(pids) == 1:
				if err != nil || (st.State != supervisor.StateRunning && st.State != supervisor.StateStarting) {
					t.Fatalf("QEMU runs but status says %+v %v", st, err)
				}
			case len(pids) == 0:
				if err == nil && st.State != supervisor.StateShutOff {
					t.Fatalf("no QEMU but status says %+v", st)
				}
				if err != nil && !errors.Is(err, supervisor.ErrNotFound) {
					t.Fatal(err)
				}
			default:
				t.Fatalf("%d QEMU processes", len(pids))
			}
			// The lock died with the process: the next up goes through.
			res, err := sup.Up(ctx, f)
			if err != nil {
				t.Fatalf("up after a crash at %s: %v", step, err)
			}
			t.Logf("killed after %s: QEMU processes %d, status %q, next up %s", step, len(pids), st.State, res[0].Action)
			if n := len(qemuPIDs(t, "killed")); n != 1 {
				t.Fatalf("%d QEMU processes after up", n)
			}
			if _, err := sup.Down(ctx, "killed"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
