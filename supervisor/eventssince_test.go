package supervisor_test

import (
	"context"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// eventsSinceStart: a caller that subscribes after starting the VM gets
// its "started" event with EventsSince (Events gives only what comes).
func eventsSinceStart(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, t0 time.Time) {
	t.Helper()
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	evs, err := sup.EventsSince(ectx, "intr", t0)
	if err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-evs:
			if !ok {
				t.Fatalf("EventsSince closed before the started event")
			}
			if e.Source == "vmsup" && e.Kind == supervisor.EventStarted {
				return
			}
		case <-timeout:
			t.Errorf("EventsSince(t0) gave no started event within 10s")
			return
		}
	}
}
