package fleettest_test

import (
	"context"
	"testing"
	"time"

	"github.com/vmsup/vmsup/fleet/fleettest"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// newFleet starts a fleet for the test (stopped when it ends).
func newFleet(t *testing.T, o fleettest.Options) *fleettest.Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := fleettest.Start(ctx, env, vmsupBin, t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func ls(t *testing.T, f *fleettest.Fleet) (map[string]fleettest.VM, string) {
	t.Helper()
	vms, note, err := f.Ls()
	if err != nil {
		t.Fatal(err)
	}
	return vms, note
}

// waitLs waits for fleet ls to say ok; failing, it logs the agents' tails.
func waitLs(t *testing.T, f *fleettest.Fleet, d time.Duration, what string, ok func(map[string]fleettest.VM) bool) map[string]fleettest.VM {
	t.Helper()
	vms, err := f.WaitLs(context.Background(), d, ok)
	if err != nil {
		for _, h := range f.Hosts {
			t.Logf("agent %s:\n%s", h.Name, supervisortest.Tail(h.AgentLog(), 1500))
		}
		t.Fatalf("%s: %v", what, err)
	}
	return vms
}

func counterGuest(t *testing.T, dir, name, memory, extra string) string {
	t.Helper()
	path, err := fleettest.CounterGuest(env, dir, name, memory, extra)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// quietGuest is a guest without the counter (see fleettest.QuietGuest).
func quietGuest(t *testing.T, dir, name, memory, extra string) string {
	t.Helper()
	path, err := fleettest.QuietGuest(env, dir, name, memory, extra)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
