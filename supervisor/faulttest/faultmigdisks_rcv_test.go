package faulttest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// receiverRandom kills B's receiver (the real "vmsup migrate-receive", as
// in TestFaultsMigrate's receiver-killed) at random times while the source
// A, in this process, mirrors the disk into it, a guest writer syncing
// markers all along. A kill in the copy must leave the guest on A, on its
// own image, every synced marker and the token there; B's guardian removes
// its QEMU, its copy of the image and its journal; the next migration
// succeeds.
func (m *diskFaults) receiverRandom(t *testing.T, ctx context.Context) string {
	op := m.op("receiver-random")
	var k *mirrorKill
	op.Check = func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
		t.Helper()
		m.check(t, ctx, on, st)
		if k.landed && on != m.a {
			t.Fatalf("the receiver died in the copy, but the guest runs on %s", on.Name)
		}
		if got := supervisortest.ReadGuestData(t, ctx, st.Console, len(diskToken)); got != diskToken {
			t.Fatalf("the data disk on %s: %q", on.Name, got)
		}
		n := supervisortest.StopMarkWriter(t, ctx, st.Console)
		supervisortest.CheckMarks(t, ctx, st.Console, n)
		t.Logf("%d markers synced so far, all on %s's image", n, on.Name)
	}
	// The clean run times the copy: the kills land within it.
	k = m.migrateKilled(t, ctx, 0)
	if err := k.err; err != nil || k.ready.IsZero() {
		t.Fatalf("clean run: %v (copy in sync: %v)", err, !k.ready.IsZero())
	}
	copyTime := k.ready.Sub(k.started)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	kills := supervisortest.RandomKills
	if n, err := strconv.Atoi(os.Getenv("VMSUP_FAULTS_RANDOM")); err == nil {
		kills = n
	}
	t.Logf("receiver: the copy took %s; %d random kills within it (seed %d)", copyTime.Round(time.Millisecond), kills, seed)
	landed := 0
	for range kills {
		// Between 5% and 90% of the copy: inside it, however the host's
		// speed varies from run to run.
		at := copyTime/20 + time.Duration(rng.Int64N(int64(copyTime*17/20)))
		t0 := time.Now()
		k = m.migrateKilled(t, ctx, at)
		if k.landed {
			landed++
		}
		where := "after the copy was in sync"
		switch {
		case !k.fired:
			where = "not fired: the migration ended first"
		case k.landed:
			where = "during the copy"
		}
		supervisortest.AfterKill(t, ctx, op, fmt.Sprintf("receiver on B killed %s into the copy, %s (%v)",
			at.Round(time.Millisecond), where, k.err), t0)
	}
	if landed == 0 && kills > 0 {
		t.Fatalf("none of %d random receiver kills landed in the copy (it took %s in the clean run)", kills, copyTime)
	}
	t.Logf("FAULTS receiver-random: %d kills, %d during the copy, all settled", kills, landed)
	return fmt.Sprintf("receiver-random %d/%d", landed, kills)
}

// migrateKilled brings the guest to A, starts the guest's marker writer
// and migrates it to B from this process, B's receiver's process group
// killed at (after the copy jobs started; 0: never).
func (m *diskFaults) migrateKilled(t *testing.T, ctx context.Context, at time.Duration) *mirrorKill {
	t.Helper()
	if on := supervisortest.SettleOp(t, ctx, m.op("receiver-random"), nil); on != m.a {
		m.again(t, ctx, on, supervisor.Status{})
	}
	st, err := m.a.Sup.Status(ctx, m.vm)
	if err != nil {
		t.Fatal(err)
	}
	supervisortest.StartMarkWriter(t, ctx, st.Console)
	k := &mirrorKill{pidf: filepath.Join(t.TempDir(), "pid"), at: at}
	m.mu.Lock()
	// setsid: its own process group, the namespaces' nsenter included.
	m.nextB = append([]string{"setsid", "sh", "-c", `echo $$ >"$0"; exec "$@"`, k.pidf}, m.host[m.b].Transport("")...)
	m.mu.Unlock()
	sup := m.host[m.a].WithHook(t, k.hook)
	o := supervisor.MigrateOptions{To: "B", Address: m.host[m.b].Addr, Transport: m.toB, Dial: m.host[m.a].Dial,
		Bandwidth: 32 << 20} // the 48 MiB copy takes ~1.5 s
	_, k.err = sup.Migrate(ctx, m.vm, o)
	k.mu.Lock()
	k.done = true // a kill not fired yet is not to be
	k.mu.Unlock()
	if at == 0 && k.err == nil { // the clean run: its writer stops on B
		if st, err = m.b.Sup.Status(ctx, m.vm); err != nil {
			t.Fatal(err)
		}
		supervisortest.StopMarkWriter(t, ctx, st.Console)
	}
	return k
}

// mirrorKill is a source's hook: it times the copy (its steps
// migrate-disks-mirroring and migrate-disks-ready) and kills the
// receiver's process group (its pid in pidf) at after the first.
type mirrorKill struct {
	pidf           string
	at             time.Duration
	mu             sync.Mutex
	started, ready time.Time
	fired, landed  bool // killed; before the copy was in sync
	done           bool // the migration returned
	err            error
}

func (k *mirrorKill) hook(_, step string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch step {
	case "migrate-disks-mirroring":
		k.started = time.Now()
		if k.at > 0 {
			time.AfterFunc(k.at, k.kill)
		}
	case "migrate-disks-ready":
		k.ready = time.Now()
	}
}

func (k *mirrorKill) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return
	}
	b, _ := os.ReadFile(k.pidf)
	var pid int
	fmt.Sscan(string(b), &pid)
	if pid > 0 && syscall.Kill(-pid, syscall.SIGKILL) == nil {
		k.fired, k.landed = true, k.ready.IsZero()
	}
}
