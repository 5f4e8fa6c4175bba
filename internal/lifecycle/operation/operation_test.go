package operation

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// TestKernel: an operation journals its intent and every step through one
// point (After sees each); a command that finds one left settles it with
// its kind's recoverer, which reads the steps and the intent and may
// journal more; a recoverer that fails leaves the journal for the next
// command.
func TestKernel(t *testing.T) {
	var seen []string
	k := New(Options{Store: vmstore.Store{Root: t.TempDir()}, After: func(_, step string) { seen = append(seen, step) }})
	var got string
	k.Register("thing", func(_ context.Context, vm string, o *Op) (string, error) {
		in, err := IntentOf[map[string]string](o)
		if err != nil {
			return "", err
		}
		got = vm + " " + in["what"] + " " + strings.Join(stepStrings(o.Done()), ",") + " by " + o.SettledBy()
		o.Step("settled") // a recoverer journals through the same point
		return "done", nil
	})
	ctx := context.Background()
	lk, note, err := k.Lock(ctx, "web", "thing")
	if err != nil || note != "" {
		t.Fatalf("lock: %q %v", note, err)
	}
	o, err := k.Begin(ctx, "web", "thing", map[string]string{"what": "x"})
	if err != nil {
		t.Fatal(err)
	}
	o.Step("one")
	o.Step("two")
	o.Close() // its command dies here
	lk.Unlock()
	lk, note, err = k.Lock(ctx, "web", "other") // the next command settles it first
	if err != nil || note != "recovered an interrupted thing: done" {
		t.Fatalf("the next command: %q %v", note, err)
	}
	lk.Unlock()
	if got != "web x one,two by other" || !o.Has("two") {
		t.Fatalf("recoverer saw %q", got)
	}
	if strings.Join(seen, ",") != "one,two,settled" {
		t.Errorf("After saw %q", seen)
	}

	// A recoverer that fails: the journal stays.
	k.Register("stuck", func(context.Context, string, *Op) (string, error) { return "", errors.New("QEMU does not answer") })
	o, _ = k.Begin(ctx, "web", "stuck", nil)
	o.Close()
	if _, err := k.Settle(ctx, "web", "status"); err == nil || !strings.Contains(err.Error(), `vm "web": an interrupted stuck`) {
		t.Errorf("failed recovery: %v", err)
	}
	if p, _ := k.Pending("web"); p == nil || p.Kind() != "stuck" {
		t.Errorf("the journal of a failed recovery: %+v", p)
	} else {
		p.End()
	}
}

// TestRunAndHolding: Run journals a list of named steps and ends the
// operation; in a context Holding the lock, Lock borrows it (no busy, no
// second settle), while another command is refused as busy.
func TestRunAndHolding(t *testing.T) {
	var seen []string
	store := vmstore.Store{Root: t.TempDir()}
	k := New(Options{Store: store, After: func(_, step string) { seen = append(seen, step) }})
	k.Register("list", func(context.Context, string, *Op) (string, error) { return "", nil })
	ctx := context.Background()
	list := []steps.Step{
		{Name: "a", Do: func(context.Context) error { return nil }},
		{Name: "b", Do: func(context.Context) error { return nil }},
	}
	if err := k.Run(ctx, "db", "list", nil, list); err != nil {
		t.Fatal(err)
	}
	if p, _ := k.Pending("db"); p != nil || strings.Join(seen, ",") != "a,b" {
		t.Fatalf("after Run: pending %+v, steps %q", p, seen)
	}
	lk, _, err := k.Lock(ctx, "db", "apply")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock()
	in, _, err := k.Lock(Holding(ctx, "db"), "db", "disk-attach")
	if err != nil {
		t.Fatalf("an operation under its command's lock: %v", err)
	}
	in.Unlock() // borrowed: nothing
	var busy *vmstore.BusyError
	if _, _, err := k.Lock(ctx, "db", "snapshot"); !errors.As(err, &busy) || busy.Op != "apply" {
		t.Errorf("another command during the apply: %v", err)
	}
}

// TestBeginRefusesUnregistered: a kernel with nothing registered begins
// nothing (a kill would leave a journal no recoverer settles), Begin,
// BeginGuarded and Run alike, and writes no journal.
func TestBeginRefusesUnregistered(t *testing.T) {
	k := New(Options{Store: vmstore.Store{Root: t.TempDir()}})
	ctx := context.Background()
	want := `vm "web": operation "thing" has no recoverer registered: refused before anything was done (a bug in vmsup)`
	if _, err := k.Begin(ctx, "web", "thing", nil); !errors.Is(err, ErrUnregistered) || err.Error() != want {
		t.Errorf("Begin: %v", err)
	}
	guarded := false
	if _, _, err := k.BeginGuarded(ctx, "web", "thing", nil, func() func() { guarded = true; return func() {} }); !errors.Is(err, ErrUnregistered) || guarded {
		t.Errorf("BeginGuarded: %v (guardian started: %v)", err, guarded)
	}
	ran := false
	list := []steps.Step{{Name: "a", Do: func(context.Context) error { ran = true; return nil }}}
	if err := k.Run(ctx, "web", "thing", nil, list); !errors.Is(err, ErrUnregistered) || ran {
		t.Errorf("Run: %v (ran: %v)", err, ran)
	}
	if p, _ := k.Pending("web"); p != nil {
		t.Errorf("a refused operation left a journal: %+v", p)
	}
}

// TestSettleGivesUpUnknownKind: a journal whose kind no recoverer knows
// (another vmsup's) is not dropped as if nothing happened: the VM is
// stopped (GiveUp), the journal ends and the error says so in one line; a
// VM that cannot be stopped keeps its journal.
func TestSettleGivesUpUnknownKind(t *testing.T) {
	var stopped []string
	stopErr := errors.New("systemd does not answer")
	var fail bool
	k := New(Options{Store: vmstore.Store{Root: t.TempDir()}, GiveUp: func(_ context.Context, vm string) error {
		if fail {
			return stopErr
		}
		stopped = append(stopped, vm)
		return nil
	}})
	k.Register("gone-kind", func(context.Context, string, *Op) (string, error) { return "", nil })
	ctx := context.Background()
	o, err := k.Begin(ctx, "web", "gone-kind", nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	k = New(Options{Store: k.o.Store, GiveUp: k.o.GiveUp}) // a vmsup that does not know the kind

	fail = true
	if _, err := k.Settle(ctx, "web", "status"); !errors.Is(err, stopErr) || !strings.Contains(err.Error(), "the journal stays") {
		t.Errorf("a VM that could not be stopped: %v", err)
	}
	if p, _ := k.Pending("web"); p == nil {
		t.Fatal("the journal was dropped though the VM could not be stopped")
	} else {
		p.Close()
	}

	fail = false
	_, err = k.Settle(ctx, "web", "status")
	if !errors.Is(err, ErrUnregistered) || !strings.Contains(err.Error(), `vm "web": an interrupted gone-kind (pid `) ||
		!strings.Contains(err.Error(), "gave it up: the VM is off, its disks and records untouched") || strings.Contains(err.Error(), "\n") {
		t.Errorf("unknown kind: %v", err)
	}
	if strings.Join(stopped, ",") != "web" {
		t.Errorf("GiveUp stopped %q, want web", stopped)
	}
	if p, _ := k.Pending("web"); p != nil {
		t.Errorf("the journal stays after giving up: %+v", p)
	}
	if note, err := k.Settle(ctx, "web", "status"); note != "" || err != nil {
		t.Errorf("the next command: %q %v", note, err)
	}

	// A kernel with nothing to stop (the networks'): the journal ends, and
	// the error does not claim a VM was stopped.
	bare := New(Options{Store: k.o.Store})
	bare.Register("gone-kind", func(context.Context, string, *Op) (string, error) { return "", nil })
	o, _ = bare.Begin(ctx, "web", "gone-kind", nil)
	o.Close()
	bare = New(Options{Store: k.o.Store})
	if _, err := bare.Settle(ctx, "web", "status"); !errors.Is(err, ErrUnregistered) || !strings.HasSuffix(err.Error(), "gave it up (nothing was undone)") {
		t.Errorf("no GiveUp: %v", err)
	}
	if p, _ := bare.Pending("web"); p != nil {
		t.Errorf("the journal stays without GiveUp: %+v", p)
	}
}

func stepStrings(ss []Step) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// TestSettleDropsUnwritten: a journal its command left unwritten (killed
// inside Begin, before the operation was under way: zeros in the file) is
// dropped with a note; the VM is not stopped as for an unknown kind, since
// nothing of the operation happened.
func TestSettleDropsUnwritten(t *testing.T) {
	var stopped []string
	store := vmstore.Store{Root: t.TempDir()}
	k := New(Options{Store: store, GiveUp: func(_ context.Context, vm string) error {
		stopped = append(stopped, vm)
		return nil
	}})
	if err := store.Paths("web").MakeRecords(); err != nil {
		t.Fatal(err)
	}
	o, err := store.BeginOp("web", "gone-kind", nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	// As a kill between the file's creation and its first write leaves it.
	if err := os.Truncate(store.Paths("web").Records+"/op.json", 0); err != nil {
		t.Fatal(err)
	}
	note, err := k.Settle(context.Background(), "web", "status")
	if err != nil || !strings.Contains(note, "dropped an empty journal") {
		t.Fatalf("Settle: %q %v", note, err)
	}
	if len(stopped) != 0 {
		t.Errorf("GiveUp stopped %q for a journal of nothing", stopped)
	}
	if p, _ := k.Pending("web"); p != nil {
		t.Errorf("the empty journal stays: %+v", p)
	}
}
