package machine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
)

// syncBuffer is a log that a test reads while Settle writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// newSettleTest is an Env on a fresh root whose guardian retries quickly,
// and a VM with a journal whose recovery fails (as a migration
// destination's journal with no intent does).
func newSettleTest(t *testing.T, retry retryPolicy) (*Env, *syncBuffer) {
	t.Helper()
	log := &syncBuffer{}
	s, err := New(Options{Root: t.TempDir(), Self: "/bin/true", Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.settleRetry = retry
	s.ops.Register("test-fails", func(context.Context, string, *operation.Op) (string, error) {
		return "", errors.New("the journal has no intent")
	})
	if _, err := s.state.BeginOp("vm1", "test-fails", nil); err != nil {
		t.Fatal(err)
	}
	return s, log
}

// TestSettleRetries: a guardian whose recovery fails logs it and tries
// again, letting the VM's lock go in between, until a try succeeds.
func TestSettleRetries(t *testing.T) {
	s, log := newSettleTest(t, retryPolicy{For: time.Minute, First: 20 * time.Millisecond, Max: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		note string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		note, err := s.Settle(ctx, "vm1")
		done <- result{note, err}
	}()
	for strings.Count(log.String(), "trying again") < 2 {
		select {
		case r := <-done:
			t.Fatalf("Settle ended before retrying: %q, %v", r.note, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !strings.Contains(log.String(), "the journal has no intent") {
		t.Errorf("the retries' log does not say why: %s", log.String())
	}
	// Between two tries the lock is free: swap in a journal that recovers.
	lk, err := s.state.TryLock(ctx, "vm1", "test")
	if err != nil || lk == nil {
		t.Fatalf("the VM's lock is held between two tries: %v", err)
	}
	op, err := s.state.PendingOp("vm1")
	if err != nil || op == nil {
		t.Fatalf("pending op: %v %v", op, err)
	}
	op.End()
	s.ops.Register("test-settles", func(context.Context, string, *operation.Op) (string, error) { return "settled", nil })
	if _, err := s.state.BeginOp("vm1", "test-settles", nil); err != nil {
		t.Fatal(err)
	}
	lk.Unlock()
	r := <-done
	if r.err != nil || !strings.Contains(r.note, "recovered an interrupted test-settles: settled") {
		t.Fatalf("Settle: %q, %v", r.note, r.err)
	}
	if op, _ := s.state.PendingOp("vm1"); op != nil {
		t.Errorf("a journal is left: %+v", op)
	}
}

// TestSettleGivesUp: the retries are bounded; the journal then stays for
// the next command.
func TestSettleGivesUp(t *testing.T) {
	s, _ := newSettleTest(t, retryPolicy{For: 300 * time.Millisecond, First: 50 * time.Millisecond, Max: 100 * time.Millisecond})
	t0 := time.Now()
	_, err := s.Settle(context.Background(), "vm1")
	if err == nil || !strings.Contains(err.Error(), "gave up after") || !strings.Contains(err.Error(), "the journal has no intent") {
		t.Fatalf("Settle: %v (want it to give up, saying why)", err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("gave up after %s, want about 300ms", took)
	}
	if op, _ := s.state.PendingOp("vm1"); op == nil {
		t.Error("the journal was dropped: the next command could not settle it")
	}
}
