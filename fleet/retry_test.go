package fleet

import (
	"slices"
	"testing"
	"time"
)

// TestRetryBackoff: 1 s after the first failure, then twice as late up to
// 30 s; a success starts over.
func TestRetryBackoff(t *testing.T) {
	now := time.Unix(1000, 0)
	r := retries{clock: func() time.Time { return now }}
	var got []time.Duration
	for range 7 {
		got = append(got, r.failed("a"))
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(got, want) {
		t.Fatalf("delays %v; want %v", got, want)
	}
	if r.ready("a") || !r.ready("b") {
		t.Fatal("a ready at once after a failure, or b (never failed) not ready")
	}
	now = now.Add(30 * time.Second)
	if !r.ready("a") {
		t.Fatal("a not ready after its delay")
	}
	r.succeeded("a")
	if d := r.failed("a"); d != time.Second {
		t.Fatalf("after a success the first delay is %s; want 1s", d)
	}
}

// TestDrainRetarget: a drain whose migration to h2 failed picks another
// host that fits (h3), and h2 again only when no other host fits.
func TestDrainRetarget(t *testing.T) {
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
	putHost(t, s, Host{Name: "h3", CPUs: 4, Memory: 512 << 20}) // less free memory: not the first choice
	if err := s.Cordon(ctx, "h1", true); err != nil {
		t.Fatal(err)
	}
	target := func() Placement {
		t.Helper()
		if err := sch.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		snap, err := s.Load(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Placements["a"].Value
	}
	// What the agent does when the migration fails (migrationFailed).
	fail := func(p Placement) {
		t.Helper()
		snap, _ := s.Load(ctx, false)
		next := p
		next.Target, next.FailedTargets = "", appendNew(p.FailedTargets, p.Target)
		if ok, err := s.movePlacement(ctx, "a", snap.Placements["a"].Rev, next, nil, nil); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	p := target()
	if p.Target != "h2" {
		t.Fatalf("first target %+v; want h2 (most free memory)", p)
	}
	fail(p)
	if p = target(); p.Target != "h3" {
		t.Fatalf("after a failed migration to h2: %+v; want h3", p)
	}
	fail(p)
	if p = target(); p.Target != "h2" || !slices.Equal(p.FailedTargets, []string{"h2", "h3"}) {
		t.Fatalf("after h2 and h3 failed: %+v; want h2 again (no other host fits), both remembered", p)
	}
}
