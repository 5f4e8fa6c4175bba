package faulttest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestFaultsMigrateLocalDisks: storage migration between two hosts whose
// disk directory is each one's own (supervisortest.LocalDisks), the CLI
// killed after every step of the source's side (the disks' copy's steps
// included) both ways and at random times (the copy is throttled so that
// some land in it), then the receiver killed after every step of its own
// (its disk-copies step included), then at random times while the source
// mirrors the disk into it. After each kill the guardians alone must
// settle it: one running copy, the disk's image on its host only (the
// loser's copy removed), and the next migration succeeds; the data written
// before the first kill reads back at the end (and after each random
// receiver kill, with the markers a guest writer synced meanwhile).
func TestFaultsMigrateLocalDisks(t *testing.T) {
	ctx := supervisortest.Context(t, 40*time.Minute)
	ha, hb := supervisortest.TwoHosts(t, env, vmsupBin)
	m := &diskFaults{vm: "fmld", dir: t.TempDir()}
	m.disk = filepath.Join(m.dir, "disks", "data.qcow2")
	supervisortest.LocalDisks(t, ha, hb, filepath.Dir(m.disk))
	f := supervisortest.LocalDiskGuest(t, env, m.dir, m.vm, m.disk, "")
	if _, err := ha.Sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ha.Sup.Down(context.Background(), m.vm)
		hb.Sup.Down(context.Background(), m.vm)
	})
	st, _ := ha.Sup.Status(ctx, m.vm)
	testenv.WaitLog(t, st.ConsoleLog, "VMSUP-SHELL-READY", 90*time.Second)
	supervisortest.WriteGuestData(t, ctx, st.Console, diskToken)
	// 48 MiB of data to copy (zeros cost nothing): at 32 MiB/s the copy
	// takes a good part of each run, where random kills land.
	supervisortest.GuestExec(t, ctx, st.Console, "dd if=/dev/urandom of=/dev/vda bs=1M seek=8 count=48 conv=fsync 2>/dev/null")
	m.a = sideOf(t, "A", ha.SD, ha.Root, ha.UnitDir(), ha.Sup)
	m.b = sideOf(t, "B", hb.SD, hb.Root, hb.UnitDir(), hb.Sup)
	m.host = map[*faultSide]*supervisortest.Host{m.a: ha, m.b: hb}
	// Each side reaches the other's receiver through a broker: B's CLI, and
	// either side's guardian asking the other (a sandbox has its own /proc).
	m.toA = ha.Broker(t)
	m.toB = hb.BrokerFor(t, func() []string {
		m.mu.Lock()
		defer m.mu.Unlock()
		if next := m.nextB; next != nil { // a receiver under fault, once
			m.nextB = nil
			return next
		}
		return hb.Transport("")
	})

	var counts []string
	for _, sub := range []struct {
		name string
		run  func(t *testing.T, ctx context.Context) string
	}{{"cli", m.cli}, {"receiver-steps", m.receiverSteps}, {"receiver-random", m.receiverRandom}} {
		if !t.Run(sub.name, func(t *testing.T) { counts = append(counts, sub.run(t, ctx)) }) {
			return
		}
	}
	var st2 supervisor.Status
	on := supervisortest.SettleGuarded(t, ctx, m.vm, []*faultSide{m.a, m.b}, "", &st2)
	if got := supervisortest.ReadGuestData(t, ctx, st2.Console, len(diskToken)); got != diskToken {
		t.Fatalf("the data disk on %s after all kills: %q", on.Name, got)
	}
	t.Logf("FAULTS migrate local disks: %s; the data reads back on %s", strings.Join(counts, ", "), on.Name)
}

// diskToken is written at the start of the data disk before the first kill.
const diskToken = "vmsup-disk-faults-3"

// diskFaults is the guest of TestFaultsMigrateLocalDisks on its two hosts.
type diskFaults struct {
	vm, dir, disk string
	a, b          *faultSide
	host          map[*faultSide]*supervisortest.Host
	toA, toB      []string
	mu            sync.Mutex
	nextB         []string // the next receiver toB runs (then plain ones)
	trace         string   // the steps the CLI journaled, since the last check
}

func (m *diskFaults) other(on *faultSide) *faultSide {
	if on == m.a {
		return m.b
	}
	return m.a
}

// job is the CLI migrating from on to the other side: A's runs where this
// test does (A's view of the disks), B's in B's namespaces.
func (m *diskFaults) job(on *faultSide) faultJob {
	to := m.host[m.other(on)]
	j := on.Job
	j.Op, j.VM, j.To, j.Address = "migrate", m.vm, to.Name, to.Addr
	if on == m.a {
		j.Transport, j.DialNetns = m.toB, m.host[on].Netns
	} else {
		j.Transport, j.Enter = m.toA, m.host[on].CLIEnter()
	}
	return j
}

// again is the next migration, from on to the other side: it must succeed.
func (m *diskFaults) again(t *testing.T, ctx context.Context, on *faultSide, _ supervisor.Status) {
	t.Helper()
	if killed, out, _ := supervisortest.RunJob(t, ctx, m.job(on), 0); killed || strings.TrimSpace(out) != "" {
		t.Fatalf("the next migration (%s -> %s): killed %v: %s", on.Name, m.other(on).Name, killed, out)
	}
}

// check: the disk's image is on the host running the guest, not on the
// other one (a destination's copy or a source's image, removed).
func (m *diskFaults) check(t *testing.T, _ context.Context, on *faultSide, _ supervisor.Status) {
	t.Helper()
	if b, err := os.ReadFile(m.trace); err == nil {
		steps := strings.Fields(string(b))
		if len(steps) == 0 {
			steps = []string{"none"}
		}
		t.Logf("the CLI had journaled up to %q", steps[len(steps)-1])
		os.Remove(m.trace)
	}
	for _, s := range []*faultSide{m.a, m.b} {
		argv := []string{"test", "-e", m.disk}
		if s == m.b {
			argv = append([]string{"nsenter", "-t", fmt.Sprint(s.SD.PID1), "-m"}, argv...)
		}
		there := exec.Command(argv[0], argv[1:]...).Run() == nil
		if there != (s == on) {
			t.Fatalf("%s: the disk's image there: %v; the guest runs on %s", s.Name, there, on.Name)
		}
	}
}

func (m *diskFaults) op(name string) supervisortest.FaultOp {
	return supervisortest.FaultOp{Name: name, VM: m.vm, Sides: []*faultSide{m.a, m.b}, Guarded: true,
		Before: func(*testing.T, context.Context, *faultSide) {}, Check: m.check, Again: m.again}
}

// cli kills the CLI after each of its steps, each way, and at random.
func (m *diskFaults) cli(t *testing.T, ctx context.Context) string {
	op := m.op("migrate-disks")
	op.Random, op.BothWays = 2*supervisortest.RandomKills, true
	m.trace = filepath.Join(t.TempDir(), "steps")
	op.Job = func(on *faultSide) faultJob {
		j := m.job(on)
		j.Bandwidth = 32 << 20 // the 48 MiB copy takes ~1.5 s: random kills land in it
		if j.Trace == "" {
			j.Trace = m.trace
			os.Remove(m.trace) // this run's steps only
		}
		return j
	}
	n := supervisortest.RunFaults(t, ctx, op)
	return fmt.Sprintf("cli %d+%d", n.StepKills, n.RandomKills+n.RandomMissed)
}

// receiverSteps kills B's receiver right after each step it reports, the
// source A (in this process).
func (m *diskFaults) receiverSteps(t *testing.T, ctx context.Context) string {
	op := m.op("receiver-disks")
	migrate := func(killAfter, trace string) error {
		j := m.b.Job
		j.VM, j.KillAfter, j.Trace = m.vm, killAfter, trace
		m.mu.Lock()
		m.nextB = m.host[m.b].ReceiverTransportOf(j)
		m.mu.Unlock()
		o := supervisor.MigrateOptions{To: "B", Address: m.host[m.b].Addr, Transport: m.toB, Dial: m.host[m.a].Dial}
		_, err := m.a.Sup.Migrate(ctx, m.vm, o)
		return err
	}
	toA := func() {
		if on := supervisortest.SettleOp(t, ctx, op, nil); on != m.a {
			m.again(t, ctx, on, supervisor.Status{})
		}
	}
	toA()
	trace := filepath.Join(t.TempDir(), "trace")
	if err := migrate("", trace); err != nil {
		t.Fatalf("clean run: %v", err)
	}
	b, _ := os.ReadFile(trace)
	steps := slices.Compact(strings.Split(strings.TrimSpace(string(b)), "\n"))
	t.Logf("receiver: steps %q", steps)
	if !slices.Contains(steps, supervisor.StepCopies) {
		t.Fatalf("the receiver did not report its step %q", supervisor.StepCopies)
	}
	for _, step := range steps {
		toA()
		t0 := time.Now()
		err := migrate(step, "")
		if err == nil {
			t.Fatalf("receiver on B: not killed after step %q", step)
		}
		supervisortest.AfterKill(t, ctx, op, fmt.Sprintf("receiver on B killed after step %q (%v)", step, err), t0)
	}
	return fmt.Sprintf("receiver-steps %d", len(steps))
}
