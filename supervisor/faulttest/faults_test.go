package faulttest_test

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
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// The fault suite: each multi-step command runs in a child process that is
// killed with SIGKILL after each of its steps (the list the command itself
// reports, read from a clean run's AfterStep trace, not written here) and
// at random times. After each kill the VM must settle, by itself (the
// migration's guardian) or at the next command (status), to exactly one
// QEMU running the guest, a status that says so, and nothing half-made.

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
	// revive, when set, brings the VM up again before it is settled (an
	// operation on a VM that is off: before shut it down).
	revive func(t *testing.T, ctx context.Context, on *faultSide)
	// markers is the directory of the VM's shared disk (migration markers).
	markers string
	// guarded: the command has a guardian (a migration), which alone must
	// settle what a kill left (supervisortest.SettleGuarded).
	guarded bool
	// bothWays: each step kill is made once from each side (again, which
	// moves the guest to the other side, brings it where the kill starts).
	bothWays bool
}

// faultCounts is what a run of one op did, for the summary line.
type faultCounts struct {
	steps, stepKills, randomKills, randomMissed int
}

// randomKills is how many random-time kills each op gets after its step
// kills. The step kills cover every gap between two steps; random ones
// probe inside steps. Three keep the suite near its time on 2 cores (ten
// did not: the guests' CPU, not waiting, fills it); VMSUP_FAULTS_RANDOM=N
// sets more for a longer hunt.
const randomKills = 3

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
	if killed, out, _ := supervisortest.RunJob(t, ctx, j, 0); killed || strings.TrimSpace(out) != "" {
		t.Fatalf("%s: clean run: killed %v, output %q", op.name, killed, out)
	}
	b, _ := os.ReadFile(trace)
	steps := strings.Split(strings.TrimSpace(string(b)), "\n")
	steps = slices.Compact(steps)
	n.steps = len(steps)
	t.Logf("%s: steps %q", op.name, steps)
	starts := []*faultSide{nil} // wherever the guest runs
	if op.bothWays {
		starts = op.sides
	}
	for i, step := range steps {
		for _, from := range starts {
			on = settle(t, ctx, op, nil)
			if from != nil && on != from {
				op.again(t, ctx, on, supervisor.Status{}) // over to from
				if on = settle(t, ctx, op, nil); on != from {
					t.Fatalf("%s: the guest runs on %s, not %s", op.name, on.Name, from.Name)
				}
			}
			op.before(t, ctx, on)
			t0 := time.Now()
			j := op.job(on)
			j.KillAfter = step
			killed, out, _ := supervisortest.RunJob(t, ctx, j, 0)
			if !killed {
				t.Fatalf("%s: not killed after step %d %q: %s", op.name, i, step, out)
			}
			n.stepKills++
			after(t, ctx, op, fmt.Sprintf("after step %q on %s", step, on.Name), t0)
		}
	}
	// Random times within a clean run's length (measured again: the host's
	// speed varies).
	on = settle(t, ctx, op, nil)
	op.before(t, ctx, on)
	_, _, took := supervisortest.RunJob(t, ctx, op.job(on), 0)
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
		killed, _, _ := supervisortest.RunJob(t, ctx, op.job(on), at)
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
	how := orNone(st.Recovery)
	if op.guarded && st.Recovery == "" {
		how = "by the guardians"
	}
	t.Logf("%s: %s: settled on %s (%s) in %s", op.name, what, on.Name, how, time.Since(t0).Round(time.Millisecond))
}

func orNone(s string) string {
	if s == "" {
		return "nothing to recover"
	}
	return s
}

// settle is supervisortest.Settle (SettleGuarded for a guarded op) for
// op's VM, sides and markers: it waits until the VM settled on one side,
// checks that nothing is left half-made, and returns that side.
func settle(t *testing.T, ctx context.Context, op faultOp, stOut *supervisor.Status) *faultSide {
	t.Helper()
	if op.revive != nil {
		op.revive(t, ctx, op.sides[0])
	}
	if op.guarded {
		return supervisortest.SettleGuarded(t, ctx, op.vm, op.sides, op.markers, stOut)
	}
	return supervisortest.Settle(t, ctx, op.vm, op.sides, op.markers, stOut)
}
