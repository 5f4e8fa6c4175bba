package faulttest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestFaultsMigrate: migrate --local, then across two hosts (each way),
// the CLI killed after every step of the source's side (both ways) and at
// random times; the receiver killed mid-stream, and after every step of
// its own (each step of its hand-over both ways). A migration's guardians
// alone must settle each kill: one running copy, a truthful record on both
// hosts, and the next migration succeeds.
func TestFaultsMigrate(t *testing.T) {
	ctx := supervisortest.Context(t, 40*time.Minute)
	m := newMigFaults(t, ctx)
	var counts []string
	for _, sub := range []struct {
		name string
		run  func(t *testing.T, ctx context.Context) string
	}{
		{"local", m.local},
		{"cross-host", m.crossHost},
		{"receiver-killed", m.receiverMidStream},
		{"receiver-steps", m.receiverSteps},
	} {
		if !t.Run(sub.name, func(t *testing.T) { counts = append(counts, sub.run(t, ctx)) }) {
			break
		}
	}
	t.Logf("FAULTS migrate (step kills + random kills): %s", strings.Join(counts, ", "))
	for _, s := range []*faultSide{m.a, m.b} {
		// What the guardians did (systemd's journal of the unit, all runs).
		j, _ := s.SD.Journal(ctx, "vmsup-"+m.vm+"@settle.service")
		t.Logf("FAULTS migrate: %s's guardians settled %d interrupted operations; %d recoveries failed and were tried again",
			s.Name, strings.Count(j, "recovered an interrupted operation"), strings.Count(j, "trying again"))
	}
}

// migFaults is the guest of TestFaultsMigrate on its two hosts.
type migFaults struct {
	vm   string
	dir  string // the shared disk's directory (markers)
	a, b *faultSide
	host map[*faultSide]*supervisortest.Host
}

func newMigFaults(t *testing.T, ctx context.Context) *migFaults {
	ha, hb := supervisortest.TwoHosts(t, env, vmsupBin)
	m := &migFaults{vm: "fmig", dir: t.TempDir()}
	f := supervisortest.MigrationGuest(t, env, m.dir, m.vm, "256M", filepath.Join(m.dir, "shared-data.raw"))
	if _, err := ha.Sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ha.Sup.Down(context.Background(), m.vm)
		hb.Sup.Down(context.Background(), m.vm)
	})
	st, _ := ha.Sup.Status(ctx, m.vm)
	testenv.WaitLog(t, st.ConsoleLog, "VMSUP-COUNTER", 90*time.Second)
	m.a = sideOf(t, "A", ha.SD, ha.Root, ha.UnitDir(), ha.Sup)
	m.b = sideOf(t, "B", hb.SD, hb.Root, hb.UnitDir(), hb.Sup)
	m.host = map[*faultSide]*supervisortest.Host{m.a: ha, m.b: hb}
	return m
}

func (m *migFaults) other(on *faultSide) *faultSide {
	if on == m.a {
		return m.b
	}
	return m.a
}

// opts migrate from the side from to the other one.
func (m *migFaults) opts(from *faultSide) supervisor.MigrateOptions {
	to := m.host[m.other(from)]
	return supervisor.MigrateOptions{To: to.Name, Address: to.Addr, Transport: to.Transport(""), Dial: m.host[from].Dial}
}

// op is a guarded fault op on both sides.
func (m *migFaults) op(name string) supervisortest.FaultOp {
	return supervisortest.FaultOp{Name: name, VM: m.vm, Sides: []*faultSide{m.a, m.b}, Markers: m.dir, Guarded: true,
		Before: func(*testing.T, context.Context, *faultSide) {}, Again: m.migrateAway}
}

// migrateAway is the next migration, from on to the other side: it must
// succeed.
func (m *migFaults) migrateAway(t *testing.T, ctx context.Context, on *faultSide, _ supervisor.Status) {
	t.Helper()
	if _, err := on.Sup.Migrate(ctx, m.vm, m.opts(on)); err != nil {
		t.Fatalf("the next migration (%s -> %s): %v", on.Name, m.other(on).Name, err)
	}
}

func (m *migFaults) local(t *testing.T, ctx context.Context) string {
	op := m.op("migrate-local")
	op.Sides, op.Random = []*faultSide{m.a}, supervisortest.RandomKills
	op.Job = func(on *faultSide) faultJob {
		j := on.Job
		j.Op, j.VM = "migrate-local", m.vm
		return j
	}
	op.Again = func(t *testing.T, ctx context.Context, on *faultSide, _ supervisor.Status) {
		if _, err := on.Sup.Migrate(ctx, m.vm, supervisor.MigrateOptions{Local: true}); err != nil {
			t.Fatalf("the next migration: %v", err)
		}
	}
	n := supervisortest.RunFaults(t, ctx, op)
	return fmt.Sprintf("local %d+%d", n.StepKills, n.RandomKills+n.RandomMissed)
}

// crossHost kills the CLI after each of its steps, each way.
func (m *migFaults) crossHost(t *testing.T, ctx context.Context) string {
	op := m.op("migrate")
	op.Random, op.BothWays = supervisortest.RandomKills, true
	op.Job = func(on *faultSide) faultJob {
		o := m.opts(on)
		j := on.Job
		j.Op, j.VM, j.To, j.Address, j.Transport, j.DialNetns = "migrate", m.vm, o.To, o.Address, o.Transport, m.host[on].Netns
		return j
	}
	n := supervisortest.RunFaults(t, ctx, op)
	return fmt.Sprintf("cross-host %d+%d", n.StepKills, n.RandomKills+n.RandomMissed)
}

// receiverMidStream: the destination's receiver dies mid-stream (SIGKILL),
// each way in turn: the source runs on, and the destination's guardian
// tears its QEMU down.
func (m *migFaults) receiverMidStream(t *testing.T, ctx context.Context) string {
	op := m.op("receiver-killed")
	const kills = 6
	for i := range kills {
		on := supervisortest.SettleOp(t, ctx, op, nil)
		if from := op.Sides[i%2]; on != from {
			m.migrateAway(t, ctx, on, supervisor.Status{})
			on = supervisortest.SettleOp(t, ctx, op, nil)
		}
		to := m.other(on)
		pidf := filepath.Join(t.TempDir(), "pid")
		o := m.opts(on)
		o.Transport = m.host[to].Transport("", "sh", "-c", `echo $$ >`+pidf+`; exec "$@"`, "sh")
		o.Bandwidth = 8 << 20 // a stream long enough to be cut
		delay := time.Duration(200+150*(i/2)) * time.Millisecond
		sup := m.host[on].WithHook(t, supervisortest.AfterPrepared(delay, func() {
			b, _ := os.ReadFile(pidf)
			var pid int
			fmt.Sscan(string(b), &pid)
			if pid > 0 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}))
		_, err := sup.Migrate(ctx, m.vm, o)
		t.Logf("receiver on %s killed %s after prepare: %v", to.Name, delay, err)
		after := supervisortest.SettleOp(t, ctx, op, nil)
		if err != nil && after != on {
			t.Fatalf("the migration failed but the guest runs on %s", after.Name)
		}
	}
	return fmt.Sprintf("receiver-killed %d", kills)
}

// receiverSteps kills the receiver ("vmsup migrate-receive", here the
// fault helper speaking for it) right after each step it reports: each
// step of its start once, each step of its hand-over (after cont: every
// socket's rename, the record) once each way.
func (m *migFaults) receiverSteps(t *testing.T, ctx context.Context) string {
	op := m.op("receiver")
	// The source runs in this process; the receiver is killed.
	migrate := func(on *faultSide, killAfter, trace string) error {
		to := m.other(on)
		j := to.Job
		j.VM, j.KillAfter, j.Trace = m.vm, killAfter, trace
		o := m.opts(on)
		o.Transport = supervisortest.ReceiverTransport(m.host[to].Netns, j)
		_, err := on.Sup.Migrate(ctx, m.vm, o)
		return err
	}
	trace := filepath.Join(t.TempDir(), "trace")
	if err := migrate(supervisortest.SettleOp(t, ctx, op, nil), "", trace); err != nil {
		t.Fatalf("clean run: %v", err)
	}
	b, _ := os.ReadFile(trace)
	steps := slices.Compact(strings.Split(strings.TrimSpace(string(b)), "\n"))
	t.Logf("receiver: steps %q", steps)
	for _, h := range supervisor.HandOverSteps() {
		if !slices.Contains(steps, h) {
			t.Fatalf("the receiver did not report its hand-over step %q", h)
		}
	}
	kills := 0
	for _, step := range steps {
		starts := []*faultSide{nil}
		if slices.Contains(supervisor.HandOverSteps(), step) {
			starts = op.Sides
		}
		for _, from := range starts {
			on := supervisortest.SettleOp(t, ctx, op, nil)
			if from != nil && on != from {
				m.migrateAway(t, ctx, on, supervisor.Status{})
				on = supervisortest.SettleOp(t, ctx, op, nil)
			}
			t0 := time.Now()
			err := migrate(on, step, "")
			if err == nil {
				t.Fatalf("receiver on %s: not killed after step %q", m.other(on).Name, step)
			}
			kills++
			supervisortest.AfterKill(t, ctx, op, fmt.Sprintf("receiver on %s killed after step %q (%v)", m.other(on).Name, step, err), t0)
		}
	}
	t.Logf("FAULTS receiver: %d steps, %d step kills, all settled", len(steps), kills)
	return fmt.Sprintf("receiver-steps %d", kills)
}
