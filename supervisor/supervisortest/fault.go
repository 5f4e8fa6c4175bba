package supervisortest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// A command under fault runs in a child process (the test binary again, in
// FaultHelper) so that it can be killed with SIGKILL mid-way, as a crash or
// an OOM kill would: after one of its steps (FaultJob.KillAfter) or at a
// time (RunJob's killAt). The fault suite (supervisor/faulttest) and the
// supervisor package's apply kills both run their commands this way.

// FaultJob is one command for FaultHelper, with the options of the
// Supervisor that runs it.
type FaultJob struct {
	Root, Bus, JournalDir, QEMU, Self, UnitDir, RunDir, HostCache string

	Op, VM    string
	KillAfter string // SIGKILL itself right after this step ("": never)
	Trace     string // append each step's name to this file

	File      string     `json:",omitempty"` // restart, up
	Disk      *spec.Disk `json:",omitempty"` // disk attach, detach
	NIC       *spec.NIC  `json:",omitempty"` // nic attach, detach
	Memory    spec.Size  `json:",omitempty"` // set
	To        string     `json:",omitempty"` // migrate
	Address   string     `json:",omitempty"`
	Transport []string   `json:",omitempty"`
	DialNetns string     `json:",omitempty"` // "": dial from where it runs
	Bandwidth int64      `json:",omitempty"` // migrate
	// Enter runs the job behind this command prefix (a host's namespaces:
	// Host.CLIEnter).
	Enter   []string `json:",omitempty"`
	Tag     string   `json:",omitempty"` // snapshot, snapshot-rm, revert, clone: the snapshot
	WithRAM bool     `json:",omitempty"` // snapshot: with the guest's memory
	NewName string   `json:",omitempty"` // clone
	// Dir is a backup's directory, or a disk move's target image (its
	// Tag: the disk); Incremental: a backup's kind.
	Dir         string `json:",omitempty"`
	Incremental bool   `json:",omitempty"`
}

// FaultHelper runs the job arg (FaultJob as JSON) and returns the exit
// code: the TestMain of a package that calls RunJob calls it when its
// arguments are "-fault-helper JSON".
func FaultHelper(arg string) int {
	var j FaultJob
	if err := json.Unmarshal([]byte(arg), &j); err != nil {
		fmt.Println(err)
		return 2
	}
	if j.Op == "pipe" { // a Broker's transport
		return pipe(j.Dir)
	}
	var trace *os.File
	if j.Trace != "" {
		trace, _ = os.OpenFile(j.Trace, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	}
	sup, err := supervisor.New(supervisor.Options{
		Root: j.Root, SystemdBus: j.Bus, JournalDir: j.JournalDir, QEMU: j.QEMU, Self: j.Self,
		UnitDir: j.UnitDir, RunDir: j.RunDir, BootTarget: testenv.BootTarget, HostCapsCache: j.HostCache,
		AllowPaths: testenv.AllowPaths(), BlockDirs: testenv.BlockDirs(),
		AfterStep: func(_, step string) {
			if trace != nil {
				fmt.Fprintln(trace, step)
			}
			if step == j.KillAfter {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		},
	})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	ctx := context.Background()
	out := os.Stdout
	switch j.Op {
	case "migrate-receive":
		// As "vmsup migrate-receive" (cmd/vmsup): stdin and stdout are the
		// protocol, the source may vanish at any moment.
		signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP)
		out = os.Stderr
		err = sup.Receive(ctx, os.Stdin, os.Stdout)
	case "migrate-local":
		_, err = sup.Migrate(ctx, j.VM, supervisor.MigrateOptions{Local: true})
	case "migrate", "move":
		err = moveJob(ctx, sup, j)
	case "disk-attach":
		_, err = sup.AttachDisk(ctx, j.VM, *j.Disk)
	case "disk-detach":
		err = sup.DetachDisk(ctx, j.VM, j.Disk.Name)
	case "nic-attach":
		_, err = sup.AttachNIC(ctx, j.VM, *j.NIC)
	case "nic-detach":
		err = sup.DetachNIC(ctx, j.VM, j.NIC.Name)
	case "set":
		_, err = sup.Resize(ctx, j.VM, supervisor.ResizeOptions{Memory: j.Memory})
	case "reboot":
		_, err = sup.Reboot(ctx, j.VM, supervisor.RebootACPI)
	case "restart":
		var f *spec.File
		if f, err = spec.Load(j.File); err == nil {
			_, err = sup.Restart(ctx, f)
		}
	case "up":
		var f *spec.File
		if f, err = spec.Load(j.File); err == nil {
			_, err = sup.Up(ctx, f)
		}
	case "apply":
		var f *spec.File
		if f, err = spec.Load(j.File); err == nil {
			_, err = sup.Apply(ctx, f, supervisor.ApplyOptions{})
		}
	case "snapshot":
		_, err = sup.Snapshot(ctx, j.VM, j.Tag, supervisor.SnapshotOptions{Memory: j.WithRAM})
	case "snapshot-rm":
		err = sup.RemoveSnapshot(ctx, j.VM, j.Tag, nil)
	case "revert":
		_, err = sup.RevertSnapshot(ctx, j.VM, j.Tag, true)
	case "clone":
		_, err = sup.UpFromSnapshot(ctx, j.VM, j.Tag, j.NewName)
	case "backup":
		_, err = sup.Backup(ctx, j.VM, supervisor.BackupOptions{Dir: j.Dir, Incremental: j.Incremental})
	case "disk-move":
		_, err = sup.MoveDisk(ctx, j.VM, j.Tag, supervisor.MoveOptions{To: j.Dir})
	default:
		err = fmt.Errorf("unknown op %q", j.Op)
	}
	if err != nil {
		fmt.Fprintln(out, err)
		return 1
	}
	return 0
}

// moveJob runs a migration to another host, or a move (vmsup move), as j
// says.
func moveJob(ctx context.Context, sup *supervisor.Supervisor, j FaultJob) error {
	o := supervisor.MigrateOptions{To: j.To, Address: j.Address, Transport: j.Transport, Bandwidth: j.Bandwidth}
	if j.DialNetns != "" {
		o.Dial = dialIn(j.DialNetns)
	}
	var err error
	if j.Op == "move" {
		_, err = sup.Move(ctx, j.VM, o)
	} else {
		_, err = sup.Migrate(ctx, j.VM, o)
	}
	return err
}

// ReceiverTransport is a migration transport that runs the destination's
// side as job j (op "migrate-receive": FaultHelper in this test binary,
// with j's supervisor options and KillAfter) in the network namespace at
// netns, instead of "vmsup migrate-receive": so a test kills the receiver
// right after one of its steps.
func ReceiverTransport(netns string, j FaultJob) []string {
	j.Op = "migrate-receive"
	b, _ := json.Marshal(j)
	return []string{"nsenter", "--net=" + netns, os.Args[0], "-fault-helper", string(b)}
}

// RunJob runs j in a child process (os.Args[0] -fault-helper, see
// FaultHelper); killAt > 0 kills it then (if it still runs). killed
// reports whether it died of SIGKILL; out is its output (nothing when the
// command succeeded).
func RunJob(t *testing.T, ctx context.Context, j FaultJob, killAt time.Duration) (killed bool, out string, took time.Duration) {
	t.Helper()
	b, _ := json.Marshal(j)
	argv := append(slices.Clone(j.Enter), os.Args[0], "-fault-helper", string(b))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	// Its own process group: a prefix that forks (nsenter -p) dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if killAt > 0 {
		timer := time.AfterFunc(killAt, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		defer timer.Stop()
	}
	err := cmd.Wait()
	took = time.Since(t0)
	var ee *exec.ExitError
	killed = errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	return killed, buf.String(), took
}
