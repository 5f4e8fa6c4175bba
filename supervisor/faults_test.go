package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// The fault suite: each multi-step command runs in a child process that is
// killed with SIGKILL after each of its steps (the list the command itself
// reports, read from a clean run's AfterStep trace, not written here) and
// at random times. After each kill the VM must settle, by itself (the
// migration's guardian) or at the next command (status), to exactly one
// QEMU running the guest, a status that says so, and nothing half-made.

// faultJob is one command for faultHelper.
type faultJob struct {
	Root, Bus, JournalDir, QEMU, Self, UnitDir, RunDir, HostCache string

	Op, VM    string
	KillAfter string // SIGKILL itself right after this step ("": never)
	Trace     string // append each step's name to this file

	File      string     `json:",omitempty"` // restart
	Disk      *spec.Disk `json:",omitempty"` // disk attach, detach
	NIC       *spec.NIC  `json:",omitempty"` // nic attach, detach
	Memory    spec.Size  `json:",omitempty"` // set
	To        string     `json:",omitempty"` // migrate
	Address   string     `json:",omitempty"`
	Transport []string   `json:",omitempty"`
	DialNetns string     `json:",omitempty"`
}

// faultHelper runs in the child (TestMain, "-fault-helper JSON").
func faultHelper(arg string) int {
	var j faultJob
	if err := json.Unmarshal([]byte(arg), &j); err != nil {
		fmt.Println(err)
		return 2
	}
	var trace *os.File
	if j.Trace != "" {
		trace, _ = os.OpenFile(j.Trace, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	}
	sup, err := supervisor.New(supervisor.Options{
		Root: j.Root, SystemdBus: j.Bus, JournalDir: j.JournalDir, QEMU: j.QEMU, Self: j.Self,
		UnitDir: j.UnitDir, RunDir: j.RunDir, BootTarget: testenv.BootTarget, HostCapsCache: j.HostCache,
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
	switch j.Op {
	case "migrate-local":
		_, err = sup.Migrate(ctx, j.VM, supervisor.MigrateOptions{Local: true})
	case "migrate":
		_, err = sup.Migrate(ctx, j.VM, supervisor.MigrateOptions{To: j.To, Address: j.Address, Transport: j.Transport, Dial: dialIn(j.DialNetns)})
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
	case "apply":
		var f *spec.File
		if f, err = spec.Load(j.File); err == nil {
			_, err = sup.Apply(ctx, f, supervisor.ApplyOptions{})
		}
	default:
		err = fmt.Errorf("unknown op %q", j.Op)
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

// faultSide is one host as the checks see it.
type faultSide struct {
	name string
	sd   *testenv.Systemd
	root string
	sup  *supervisor.Supervisor
	job  faultJob // its supervisor's options, for jobs run there
}

func sideOf(t *testing.T, name string, sd *testenv.Systemd, root, unitDir string, sup *supervisor.Supervisor) *faultSide {
	if sup == nil {
		sup = newSup(t, root)
	}
	return &faultSide{name: name, sd: sd, root: root, sup: sup, job: faultJob{
		Root: root, Bus: sd.BusAddress, JournalDir: sd.JournalDir, QEMU: env.QEMU, Self: vmsupBin,
		UnitDir: unitDir, RunDir: filepath.Join(root, "run"), HostCache: env.CapsCache}}
}

// runJob runs j in a child process; killAt > 0 kills it then (if it still
// runs). killed reports whether it died of SIGKILL.
func runJob(t *testing.T, ctx context.Context, j faultJob, killAt time.Duration) (killed bool, out string, took time.Duration) {
	t.Helper()
	b, _ := json.Marshal(j)
	cmd := exec.CommandContext(ctx, os.Args[0], "-fault-helper", string(b))
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if killAt > 0 {
		timer := time.AfterFunc(killAt, func() { cmd.Process.Signal(syscall.SIGKILL) })
		defer timer.Stop()
	}
	err := cmd.Wait()
	took = time.Since(t0)
	var ee *exec.ExitError
	killed = errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
	return killed, buf.String(), took
}

// faultOp is one command under test and how to bring the VM back to where
// the command starts from.
type faultOp struct {
	name  string
	vm    string
	sides []*faultSide
	// job is the command, run from the side the guest runs on.
	job func(from *faultSide) faultJob
	// before brings the VM into the command's starting state.
	before func(t *testing.T, ctx context.Context, on *faultSide)
	// check looks for what the command may leave half-made (devices,
	// grants, taps), on the side running the guest.
	check func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status)
	// again repeats or undoes the command (whichever its state calls for)
	// and must succeed.
	again func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status)
	// random is how many random-time kills (after the step kills).
	random int
	// markers is the directory of the VM's shared disk (migration markers).
	markers string
}

// faultCounts is what a run of one op did, for the summary line.
type faultCounts struct {
	steps, stepKills, randomKills, randomMissed int
}

// runFaults kills op after each of its steps, then at random times, and
// checks the VM after each kill.
func runFaults(t *testing.T, ctx context.Context, op faultOp) faultCounts {
	var n faultCounts
	on := settle(t, ctx, op, nil)
	op.before(t, ctx, on)
	// A clean run: its trace is the step list; its time bounds the random kills.
	trace := filepath.Join(t.TempDir(), "trace")
	j := op.job(on)
	j.Trace = trace
	if killed, out, _ := runJob(t, ctx, j, 0); killed || strings.TrimSpace(out) != "" {
		t.Fatalf("%s: clean run: killed %v, output %q", op.name, killed, out)
	}
	b, _ := os.ReadFile(trace)
	steps := strings.Split(strings.TrimSpace(string(b)), "\n")
	steps = slices.Compact(steps)
	n.steps = len(steps)
	t.Logf("%s: steps %q", op.name, steps)
	for i, step := range steps {
		on = settle(t, ctx, op, nil)
		op.before(t, ctx, on)
		t0 := time.Now()
		j := op.job(on)
		j.KillAfter = step
		killed, out, _ := runJob(t, ctx, j, 0)
		if !killed {
			t.Fatalf("%s: not killed after step %d %q: %s", op.name, i, step, out)
		}
		n.stepKills++
		after(t, ctx, op, fmt.Sprintf("after step %q", step), t0)
	}
	// Random times within a clean run's length (measured again: the host's
	// speed varies).
	on = settle(t, ctx, op, nil)
	op.before(t, ctx, on)
	_, _, took := runJob(t, ctx, op.job(on), 0)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	t.Logf("%s: random kills within %s (seed %d)", op.name, took.Round(time.Millisecond), seed)
	if n, err := strconv.Atoi(os.Getenv("VMSUP_FAULTS_RANDOM")); err == nil {
		op.random = n // more (or fewer) random kills, for a longer hunt
	}
	for i := 0; i < op.random; i++ {
		on = settle(t, ctx, op, nil)
		op.before(t, ctx, on)
		at := time.Duration(rng.Int64N(int64(took))) + time.Millisecond
		t0 := time.Now()
		killed, _, _ := runJob(t, ctx, op.job(on), at)
		if killed {
			n.randomKills++
		} else {
			n.randomMissed++ // it ended first: still checked
		}
		after(t, ctx, op, fmt.Sprintf("killed at %s", at.Round(time.Millisecond)), t0)
	}
	t.Logf("FAULTS %s: %d steps, %d step kills, %d random kills (%d ended before their kill), all settled",
		op.name, n.steps, n.stepKills, n.randomKills, n.randomMissed)
	return n
}

// after checks the VM after a kill, then repeats or undoes the command.
func after(t *testing.T, ctx context.Context, op faultOp, what string, t0 time.Time) {
	t.Helper()
	var ok bool
	defer func() {
		if !ok {
			t.Logf("%s: %s: failed (see above)", op.name, what)
		}
	}()
	var st supervisor.Status
	on := settle(t, ctx, op, &st)
	if op.check != nil {
		op.check(t, ctx, on, st)
	}
	if op.again != nil {
		op.again(t, ctx, on, st)
	}
	ok = true
	t.Logf("%s: %s: settled on %s (%s) in %s", op.name, what, on.name, orNone(st.Recovery), time.Since(t0).Round(time.Millisecond))
}

func orNone(s string) string {
	if s == "" {
		return "nothing to recover"
	}
	return s
}

// settle waits until no operation is pending on any side (the guardian or
// status finishes it), then checks: one QEMU in all, on the side whose
// status says running, the guest's counter advancing there, the other
// sides knowing nothing of the VM, no unit but the running one, and no
// marker, relay socket or incoming directory left. It returns that side.
func settle(t *testing.T, ctx context.Context, op faultOp, stOut *supervisor.Status) *faultSide {
	t.Helper()
	vm := op.vm
	var on *faultSide
	var st supervisor.Status
	var why, recovery string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		on, why = nil, ""
		for _, s := range op.sides {
			x, err := s.sup.Status(ctx, vm)
			if x.Recovery != "" {
				recovery = x.Recovery
			}
			switch {
			case err == nil && x.State == supervisor.StateRunning:
				if on != nil {
					why = fmt.Sprintf("running on %s and %s", on.name, s.name)
				}
				on, st = s, x
			case err != nil && !errors.Is(err, supervisor.ErrNotFound):
				why = fmt.Sprintf("%s: status: %v", s.name, err)
			case err == nil:
				why = fmt.Sprintf("%s: %s (%s)", s.name, x.State, x.Reason)
			}
			if _, err := os.Stat(filepath.Join(s.root, "records", vm, "op.json")); err == nil {
				why = s.name + ": an operation is pending"
			}
			if out, _ := s.sd.Systemctl(ctx, "list-units", "--all", "--no-legend", "--plain", "vmsup-"+vm+"@settle.service"); strings.TrimSpace(string(out)) != "" {
				why = s.name + ": the guardian runs"
			}
		}
		if on == nil && why == "" {
			why = "runs nowhere"
		}
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			for _, s := range op.sides {
				opj, _ := os.ReadFile(filepath.Join(s.root, "records", vm, "op.json"))
				holder, _ := os.ReadFile(filepath.Join(s.root, "vms", "."+vm+".lock"))
				journal, _ := s.sd.Journal(ctx, "vmsup-"+vm+"@settle.service")
				t.Logf("%s: journal %s; lock holder %q; guardian:\n%s", s.name, strings.TrimSpace(string(opj)), holder, tail(journal, 2000))
			}
			t.Fatalf("vm %s did not settle: %s (last recovery: %s)", vm, why, recovery)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// One QEMU, where status says.
	total := 0
	for _, s := range op.sides {
		pids := qemuIn(s.sd, vm)
		total += len(pids)
		if s == on && (len(pids) != 1 || pids[0] != hostPIDOf(s.sd, st.Unit)) {
			t.Fatalf("%s: status says %s runs but its QEMUs are %v", s.name, st.Unit, pids)
		}
		out, _ := s.sd.Systemctl(ctx, "list-units", "--all", "--no-legend", "--plain", "vmsup-"+vm+".service", "vmsup-"+vm+"@*")
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) > 0 && (s != on || f[0] != st.Unit) {
				t.Fatalf("%s: unit left: %s", s.name, l)
			}
		}
		dir := filepath.Join(s.root, "vms", vm)
		left, _ := filepath.Glob(filepath.Join(dir, "incoming-*"))
		socks, _ := filepath.Glob(filepath.Join(dir, "migrate-out-*"))
		if left = append(left, socks...); len(left) > 0 {
			t.Fatalf("%s: left in the state directory: %v", s.name, left)
		}
		if s != on {
			if _, err := os.Stat(dir); err == nil {
				t.Fatalf("%s: a stale state directory %s", s.name, dir)
			}
			if _, err := os.Stat(filepath.Join(s.root, "records", vm)); err == nil {
				t.Fatalf("%s: a stale record", s.name)
			}
		}
	}
	if total != 1 {
		t.Fatalf("%d QEMUs run the guest", total)
	}
	if op.markers != "" {
		if mk, _ := filepath.Glob(filepath.Join(op.markers, ".vmsup-migrate-"+vm+"-*")); len(mk) > 0 {
			t.Fatalf("markers left: %v", mk)
		}
	}
	waitCounterMoves(t, st.ConsoleLog, 30*time.Second, func() string {
		b, _ := on.sup.QMP(ctx, vm, []byte(`{"execute":"query-status"}`), false)
		r, _ := on.sup.QMP(ctx, vm, []byte(`{"execute":"human-monitor-command","arguments":{"command-line":"info registers"}}`), false)
		st, err := on.sup.Status(ctx, vm)
		j, _ := on.sd.Journal(ctx, st.Unit)
		return fmt.Sprintf("%s\n%s\nstatus %s (%s) %v\nunit journal:\n%s", b, tail(string(r), 600), st.State, st.Reason, err, tail(j, 1500))
	})
	st.Recovery = recovery
	if stOut != nil {
		*stOut = st
	}
	return on
}

// waitCounterMoves waits for three more counter lines in the log: the
// guest runs (it is not frozen, and not stopped by a migration).
func waitCounterMoves(t *testing.T, log string, d time.Duration, diag ...func() string) {
	t.Helper()
	n := len(counters(t, log))
	deadline := time.Now().Add(d)
	for len(counters(t, log)) < n+3 {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log)
			extra := ""
			for _, f := range diag {
				extra += f()
			}
			t.Fatalf("%s: the guest's counter did not move in %s; log tail:\n%s\nQEMU: %s", log, d, tail(string(b), 800), extra)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// qemuIn returns the QEMU processes in the VM's units (both names).
func qemuIn(sd *testenv.Systemd, vm string) []int {
	var out []int
	for _, u := range []string{"vmsup-" + vm + ".service", "vmsup-" + vm + "@migrated.service"} {
		pids, _ := sd.HostPIDs(u)
		for _, p := range pids {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.HasPrefix(string(b), "qemu-system") {
				out = append(out, p)
			}
		}
	}
	return out
}

// hostPIDOf is the host PID of the unit's QEMU (0 if none).
func hostPIDOf(sd *testenv.Systemd, unit string) int {
	pids, _ := sd.HostPIDs(unit)
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.HasPrefix(string(b), "qemu-system") {
			return p
		}
	}
	return 0
}
