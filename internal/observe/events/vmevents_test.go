package events

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// newEnv is a real Env on a state root of its own (systemd is not asked).
func newEnv(t *testing.T) *machine.Env {
	t.Helper()
	env, err := machine.New(machine.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return env
}

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// record appends an event to the VM's history, making its records.
func record(t *testing.T, h *machine.Env, vm string, s int, source, event, reason string) {
	t.Helper()
	p := h.State().Paths(vm)
	if err := p.MakeRecords(); err != nil {
		t.Fatal(err)
	}
	r := eventlog.Record{Time: at(s), VM: vm, Source: source, Event: event}
	if reason != "" {
		r.Data, _ = json.Marshal(map[string]string{"reason": reason})
	}
	if err := eventlog.Append(p.EventHistory(), r); err != nil {
		t.Fatal(err)
	}
}

// TestFollow: the VMs' histories come merged in time order from since on,
// with QEMU's reason; a VM without records is absent.
func TestFollow(t *testing.T) {
	h := newEnv(t)
	record(t, h, "web", 1, eventlog.SourceVmsup, Started, "")
	record(t, h, "db", 2, eventlog.SourceVmsup, Started, "")
	record(t, h, "web", 3, eventlog.SourceQEMU, "SHUTDOWN", "guest-shutdown")
	record(t, h, "web", 4, eventlog.SourceVmsup, Stopped, "guest-shutdown")
	var got []string
	emit := func(e Event) error {
		got = append(got, e.VM+" "+e.Source+" "+e.Kind+" "+e.Reason)
		return nil
	}
	if err := Follow(context.Background(), h, []string{"web", "db"}, at(2), false, emit); err != nil {
		t.Fatal(err)
	}
	want := []string{"db vmsup started ", "web qemu SHUTDOWN guest-shutdown", "web vmsup stopped guest-shutdown"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Follow (-want +got):\n%s", diff)
	}
	if err := Follow(context.Background(), h, []string{"web", "gone"}, at(0), false, emit); !errors.Is(err, machine.ErrNotFound) {
		t.Errorf("Follow of a VM without records = %v", err)
	}
	stop := errors.New("enough")
	if err := Follow(context.Background(), h, []string{"web"}, at(0), false, func(Event) error { return stop }); err != stop {
		t.Errorf("Follow = %v, want emit's error", err)
	}
}

// TestStream: a VM that is not, or does not run, has no stream; the stream
// closes at the end of the QEMU running now (a stopped event at or after
// its start), not at an earlier run's.
func TestStream(t *testing.T) {
	h := newEnv(t)
	if _, err := Stream(context.Background(), h, "web", at(0)); !errors.Is(err, machine.ErrNotFound) {
		t.Errorf("Stream without a QEMU = %v", err)
	}
	p := h.State().Paths("web")
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Stream(context.Background(), h, "web", at(0)); !errors.Is(err, machine.ErrNotRunning) {
		t.Errorf("Stream of a VM whose QEMU does not run = %v", err)
	}
	if err := os.WriteFile(p.QMP, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	app := &vmstore.Applied{Name: "web", StartedAt: at(5)}
	if err := p.MakeRecords(); err != nil {
		t.Fatal(err)
	}
	if err := h.State().WriteApplied(app, []byte("name = \"web\"\nmemory = \"64M\"\n")); err != nil {
		t.Fatal(err)
	}
	record(t, h, "web", 1, eventlog.SourceVmsup, Stopped, "an earlier run")
	record(t, h, "web", 5, eventlog.SourceVmsup, Started, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := Stream(ctx, h, "web", at(0))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for e := range ch {
		got = append(got, e.Kind)
		if e.Kind == Started {
			record(t, h, "web", 6, eventlog.SourceVmsup, Crashed, "")
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the stream did not close at the crash: %v", got)
	}
	if diff := cmp.Diff([]string{Stopped, Started, Crashed}, got); diff != "" {
		t.Errorf("Stream (-want +got):\n%s", diff)
	}
}
