package fleet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/vmsup/vmsup/internal/dev/testenv/etcdtest"
	"github.com/vmsup/vmsup/spec"
)

// newStore is a Store on a one-member etcd of the test's own.
func newStore(t *testing.T) *Store {
	t.Helper()
	c, err := etcdtest.Start(context.Background(), t.TempDir(), etcdtest.Options{Members: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl, err := c.Client(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return NewStore(cl, "/t/")
}

func vmFile(t *testing.T, name, memory, extra string) *spec.File {
	t.Helper()
	f, err := spec.Parse(filepath.Join("/nonexistent", name+".toml"), []byte(fmt.Sprintf("name = %q\nmemory = %q\n%s\n[boot]\nkernel = \"/vmlinuz\"\n", name, memory, extra)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// putHost registers a host as an agent would (without a lease here).
func putHost(t *testing.T, s *Store, h Host) {
	t.Helper()
	if err := s.PutHost(t.Context(), h, 0); err != nil {
		t.Fatal(err)
	}
}

// TestApplyGenerations: a new spec is generation 1, an unchanged one keeps
// its generation, a changed one gets the next; a file twice is refused and
// nothing of that apply is stored.
func TestApplyGenerations(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	a, b := vmFile(t, "a", "256M", ""), vmFile(t, "b", "256M", "")
	res, err := s.Apply(ctx, a, b)
	if err != nil || res[0].Action != "created" || res[0].Generation != 1 {
		t.Fatalf("first apply: %+v %v", res, err)
	}
	a2 := vmFile(t, "a", "512M", "")
	res, err = s.Apply(ctx, a2, b)
	if err != nil || res[0].Action != "updated" || res[0].Generation != 2 || res[1].Action != "unchanged" || res[1].Generation != 1 {
		t.Fatalf("second apply: %+v %v", res, err)
	}
	c := vmFile(t, "c", "256M", "")
	if _, err := s.Apply(ctx, c, vmFile(t, "c", "128M", "")); err == nil || !strings.Contains(err.Error(), "also defined") {
		t.Fatalf("a name twice: %v", err)
	}
	snap, err := s.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := snap.VMs["c"]; ok || len(snap.VMs) != 2 {
		t.Fatalf("after a refused apply: %v", snap.VMs)
	}
	if st := snap.Statuses["a"].Value; st.State != StatePending {
		t.Fatalf("a new VM's status: %+v", st)
	}
	// More VMs than etcd takes in one transaction: several, each whole.
	var many []*spec.File
	for i := range 150 {
		many = append(many, vmFile(t, fmt.Sprintf("m%d", i), "64M", ""))
	}
	if res, err := s.Apply(ctx, many...); err != nil || len(res) != 150 {
		t.Fatalf("150 VMs: %d results, %v", len(res), err)
	}
}

// TestPlacementCAS: two schedulers pass over the same fleet at once; every
// VM gets exactly one placement (the loser's compare-and-swap fails), the
// VMs spread by memory, and one too big gets the reason as its status.
func TestPlacementCAS(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	for _, h := range []string{"h1", "h2", "h3"} {
		putHost(t, s, Host{Name: h, CPUs: 4, Memory: 1 << 30})
	}
	var files []*spec.File
	for i := range 6 {
		files = append(files, vmFile(t, fmt.Sprintf("vm%d", i), "256M", ""))
	}
	files = append(files, vmFile(t, "huge", "8G", ""))
	if _, err := s.Apply(ctx, files...); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	decided := 0
	for range 2 {
		wg.Go(func() {
			sch := &Scheduler{Store: s, Decided: func(string, time.Duration) { mu.Lock(); decided++; mu.Unlock() }}
			sch.Pass(ctx) // a lost race is an error here: the next pass sees why
		})
	}
	wg.Wait()
	(&Scheduler{Store: s}).Pass(ctx)
	snap, err := s.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for name, p := range snap.Placements {
		if p.Value.Epoch != 1 {
			t.Errorf("%s: epoch %d", name, p.Value.Epoch)
		}
		per[p.Value.Host]++
	}
	if len(snap.Placements) != 6 || per["h1"] != 2 || per["h2"] != 2 || per["h3"] != 2 {
		t.Fatalf("placements per host %v (%d placed); want 2 each", per, len(snap.Placements))
	}
	if decided != 6 {
		t.Errorf("%d decisions committed for 6 VMs: a placement was made twice", decided)
	}
	if st := snap.Statuses["huge"].Value; st.State != StateUnschedulable || !strings.Contains(st.Reason, "needs 1 vCPUs and 8G") {
		t.Fatalf("huge: %+v", st)
	}
	// Each VM's placement key was written once: its version is 1.
	r, err := s.Client().Get(ctx, s.dir("placement"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		if kv.Version != 1 {
			t.Errorf("%s written %d times", kv.Key, kv.Version)
		}
	}
}

// TestDrainAndRemove: a cordoned host's VMs get a target on another host;
// rm deletes the spec and placement at once.
func TestDrainAndRemove(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	putHost(t, s, Host{Name: "h1", CPUs: 4, Memory: 1 << 30})
	if _, err := s.Apply(ctx, vmFile(t, "a", "256M", "")); err != nil {
		t.Fatal(err)
	}
	sch := &Scheduler{Store: s}
	if err := sch.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	putHost(t, s, Host{Name: "h2", CPUs: 4, Memory: 1 << 30})
	if err := s.Cordon(ctx, "h1", true); err != nil {
		t.Fatal(err)
	}
	if err := sch.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	snap, _ := s.Load(ctx, false)
	if p := snap.Placements["a"].Value; p.Host != "h1" || p.Target != "h2" {
		t.Fatalf("drain: %+v", p)
	}
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	snap, _ = s.Load(ctx, false)
	if len(snap.VMs) != 0 || len(snap.Placements) != 0 || snap.Statuses["a"].Value.State != "removing" {
		t.Fatalf("after rm: %+v %+v %+v", snap.VMs, snap.Placements, snap.Statuses)
	}
}

type countFence struct{ n int }

func (c *countFence) Fence(context.Context, string, *spec.VM) error { c.n++; return nil }

// TestDeposedScheduler: a scheduler whose election key is gone (its session
// ended) commits no placement and fences nothing; elected again, it does.
func TestDeposedScheduler(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	putHost(t, s, Host{Name: "h1", CPUs: 4, Memory: 1 << 30})
	// "zz" (its disk on RBD) is placed on a host that is gone: a failover.
	zz := vmFile(t, "zz", "256M", "[[disk]]\nname = \"d\"\ntype = \"rbd\"\npool = \"p\"\nimage = \"zz\"\n")
	if _, err := s.Apply(ctx, vmFile(t, "a", "256M", ""), zz); err != nil {
		t.Fatal(err)
	}
	snap, _ := s.Load(ctx, false)
	if ok, err := s.place(ctx, snap.VMs["zz"], "gone", nil); err != nil || !ok {
		t.Fatalf("place zz: %v %v", ok, err)
	}
	fence := &countFence{}
	sch := &Scheduler{Store: s, Fence: fence}
	elect := func() *concurrency.Session {
		sess, err := concurrency.NewSession(s.Client(), concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		el := concurrency.NewElection(sess, s.prefix+"leader")
		if err := el.Campaign(ctx, "h1"); err != nil {
			t.Fatal(err)
		}
		sch.leads(el)
		return sess
	}
	elect().Close() // revokes its lease: the election key is gone
	if err := sch.Pass(ctx); !errors.Is(err, errRaced) {
		t.Errorf("deposed pass over a new VM: %v; want it ended as raced", err)
	}
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := sch.Pass(ctx); !errors.Is(err, errNotLeader) {
		t.Errorf("deposed pass over a lost host's VM: %v; want %v", err, errNotLeader)
	}
	snap, _ = s.Load(ctx, false)
	if p := snap.Placements["zz"].Value; p.Host != "gone" || fence.n != 0 {
		t.Fatalf("a deposed scheduler moved zz (%+v) or fenced (%d times)", p, fence.n)
	}
	sess := elect()
	defer sess.Close()
	if err := sch.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	snap, _ = s.Load(ctx, false)
	if p := snap.Placements["zz"].Value; p.Host != "h1" || p.Epoch != 2 || fence.n != 1 {
		t.Fatalf("the leader's failover: %+v, fenced %d times; want zz on h1, epoch 2, fenced once", p, fence.n)
	}
}
