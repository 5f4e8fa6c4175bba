package supervisortest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// The fault suite: each multi-step command runs in a child process that is
// killed with SIGKILL after each of its steps (the list the command itself
// reports, read from a clean run's AfterStep trace, not written here) and
// at random times. After each kill the VM must settle, by itself (the
// migration's guardian) or at the next command (status), to exactly one
// QEMU running the guest, a status that says so, and nothing half-made.

// FaultOp is one command under test and how to bring the VM back to where
// the command starts from.
type FaultOp struct {
	Name  string
	VM    string
	Sides []*Side
	// Job is the command, run from the side the guest runs on.
	Job func(from *Side) FaultJob
	// Before brings the VM into the command's starting state.
	Before func(t *testing.T, ctx context.Context, on *Side)
	// Check looks for what the command may leave half-made (devices,
	// grants, taps), on the side running the guest.
	Check func(t *testing.T, ctx context.Context, on *Side, st supervisor.Status)
	// Again repeats or undoes the command (whichever its state calls for)
	// and must succeed.
	Again func(t *testing.T, ctx context.Context, on *Side, st supervisor.Status)
	// Random is how many random-time kills (after the step kills).
	Random int
	// Revive, when set, brings the VM up again before it is settled (an
	// operation on a VM that is off: before shut it down).
	Revive func(t *testing.T, ctx context.Context, on *Side)
	// Markers is the directory of the VM's shared disk (migration markers).
	Markers string
	// Guarded: the command has a guardian (a migration), which alone must
	// settle what a kill left (SettleGuarded).
	Guarded bool
	// KillSteps, when set, are the only steps killed after (a start has
	// many steps; its other ones are covered by the suites of its parts).
	KillSteps []string
	// BothWays: each step kill is made once from each side (again, which
	// moves the guest to the other side, brings it where the kill starts).
	BothWays bool
}

// FaultCounts is what a run of one op did, for the summary line.
type FaultCounts struct {
	Steps, StepKills, RandomKills, RandomMissed int
}

// RandomKills is how many random-time kills each op gets after its step
// kills. The step kills cover every gap between two steps; random ones
// probe inside steps. Three keep the suite near its time on 2 cores (ten
// did not: the guests' CPU, not waiting, fills it); VMSUP_FAULTS_RANDOM=N
// sets more for a longer hunt.
const RandomKills = 3

// RunFaults kills op after each of its steps, then at random times, and
// checks the VM after each kill.
func RunFaults(t *testing.T, ctx context.Context, op FaultOp) FaultCounts {
	var n FaultCounts
	on := SettleOp(t, ctx, op, nil)
	op.Before(t, ctx, on)
	// A clean run: its trace is the step list; its time bounds the random kills.
	trace := filepath.Join(t.TempDir(), "trace")
	j := op.Job(on)
	j.Trace = trace
	if killed, out, _ := RunJob(t, ctx, j, 0); killed || strings.TrimSpace(out) != "" {
		t.Fatalf("%s: clean run: killed %v, output %q", op.Name, killed, out)
	}
	b, _ := os.ReadFile(trace)
	steps := strings.Split(strings.TrimSpace(string(b)), "\n")
	steps = slices.Compact(steps)
	if op.KillSteps != nil {
		steps = slices.DeleteFunc(steps, func(s string) bool { return !slices.Contains(op.KillSteps, s) })
	}
	n.Steps = len(steps)
	t.Logf("%s: steps %q", op.Name, steps)
	starts := []*Side{nil} // wherever the guest runs
	if op.BothWays {
		starts = op.Sides
	}
	for i, step := range steps {
		for _, from := range starts {
			on = SettleOp(t, ctx, op, nil)
			if from != nil && on != from {
				op.Again(t, ctx, on, supervisor.Status{}) // over to from
				if on = SettleOp(t, ctx, op, nil); on != from {
					t.Fatalf("%s: the guest runs on %s, not %s", op.Name, on.Name, from.Name)
				}
			}
			op.Before(t, ctx, on)
			t0 := time.Now()
			j := op.Job(on)
			j.KillAfter = step
			killed, out, _ := RunJob(t, ctx, j, 0)
			if !killed {
				t.Fatalf("%s: not killed after step %d %q: %s", op.Name, i, step, out)
			}
			n.StepKills++
			AfterKill(t, ctx, op, fmt.Sprintf("after step %q on %s", step, on.Name), t0)
		}
	}
	// Random times within a clean run's length (measured again: the host's
	// speed varies).
	on = SettleOp(t, ctx, op, nil)
	op.Before(t, ctx, on)
	_, _, took := RunJob(t, ctx, op.Job(on), 0)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	t.Logf("%s: random kills within %s (seed %d)", op.Name, took.Round(time.Millisecond), seed)
	if n, err := strconv.Atoi(os.Getenv("VMSUP_FAULTS_RANDOM")); err == nil {
		op.Random = n // more (or fewer) random kills, for a longer hunt
	}
	for i := 0; i < op.Random; i++ {
		on = SettleOp(t, ctx, op, nil)
		op.Before(t, ctx, on)
		at := time.Duration(rng.Int64N(int64(took))) + time.Millisecond
		t0 := time.Now()
		killed, _, _ := RunJob(t, ctx, op.Job(on), at)
		if killed {
			n.RandomKills++
		} else {
			n.RandomMissed++ // it ended first: still checked
		}
		AfterKill(t, ctx, op, fmt.Sprintf("killed at %s", at.Round(time.Millisecond)), t0)
	}
	t.Logf("FAULTS %s: %d steps, %d step kills, %d random kills (%d ended before their kill), all settled",
		op.Name, n.Steps, n.StepKills, n.RandomKills, n.RandomMissed)
	return n
}

// AfterKill checks the VM after a kill, then repeats or undoes the command.
func AfterKill(t *testing.T, ctx context.Context, op FaultOp, what string, t0 time.Time) {
	t.Helper()
	var ok bool
	defer func() {
		if !ok {
			t.Logf("%s: %s: failed (see above)", op.Name, what)
		}
	}()
	var st supervisor.Status
	on := SettleOp(t, ctx, op, &st)
	if op.Check != nil {
		op.Check(t, ctx, on, st)
	}
	if op.Again != nil {
		op.Again(t, ctx, on, st)
	}
	ok = true
	how := orNone(st.Recovery)
	if op.Guarded && st.Recovery == "" {
		how = "by the guardians"
	}
	t.Logf("%s: %s: settled on %s (%s) in %s", op.Name, what, on.Name, how, time.Since(t0).Round(time.Millisecond))
}

func orNone(s string) string {
	if s == "" {
		return "nothing to recover"
	}
	return s
}

// settle is Settle (SettleGuarded for a guarded op) for
// op's VM, sides and markers: it waits until the VM settled on one side,
// checks that nothing is left half-made, and returns that side.
func SettleOp(t *testing.T, ctx context.Context, op FaultOp, stOut *supervisor.Status) *Side {
	t.Helper()
	if op.Revive != nil {
		op.Revive(t, ctx, op.Sides[0])
	}
	if op.Guarded {
		return SettleGuarded(t, ctx, op.VM, op.Sides, op.Markers, stOut)
	}
	return Settle(t, ctx, op.VM, op.Sides, op.Markers, stOut)
}
