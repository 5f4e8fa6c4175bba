package qmp

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// A fake qemu-ga that tracks its freeze state as the real one does.
func TestAgentFSFreeze(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	frozen := false
	sock := fakeAgent(t, "", "", func(cmd fakeCmd) agentReply {
		mu.Lock()
		defer mu.Unlock()
		switch cmd.Execute {
		case "guest-fsfreeze-freeze":
			if frozen {
				return agentReply{out: `{"error": {"class": "GenericError", "desc": "Command guest-fsfreeze-freeze has been disabled: the agent is in frozen state"}}` + "\n"}
			}
			frozen = true
			return agentReply{out: `{"return": 3}` + "\n"}
		case "guest-fsfreeze-thaw":
			n := 0
			if frozen {
				n = 3
			}
			frozen = false
			return agentReply{out: fmt.Sprintf(`{"return": %d}`+"\n", n)}
		case "guest-fsfreeze-status":
			if frozen {
				return agentReply{out: `{"return": "frozen"}` + "\n"}
			}
			return agentReply{out: `{"return": "thawed"}` + "\n"}
		}
		return agentReply{out: `{"error": {"class": "CommandNotFound", "desc": "x"}}` + "\n"}
	})
	a, err := DialAgent(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	if s, err := a.FSFreezeStatus(ctx); err != nil || s != "thawed" {
		t.Errorf("FSFreezeStatus = %q, %v; want thawed", s, err)
	}
	if n, err := a.FSFreeze(ctx); err != nil || n != 3 {
		t.Errorf("FSFreeze = %d, %v; want 3", n, err)
	}
	if s, err := a.FSFreezeStatus(ctx); err != nil || s != "frozen" {
		t.Errorf("FSFreezeStatus = %q, %v; want frozen", s, err)
	}
	if _, err := a.FSFreeze(ctx); !IsClass(err, ClassGenericError) {
		t.Errorf("second FSFreeze = %v, want the agent's GenericError", err)
	}
	if n, err := a.FSThaw(ctx); err != nil || n != 3 {
		t.Errorf("FSThaw = %d, %v; want 3", n, err)
	}
	if n, err := a.FSThaw(ctx); err != nil || n != 0 {
		t.Errorf("second FSThaw = %d, %v; want 0", n, err)
	}
}

// Freezing flushes the guest's filesystems: its built-in timeout must not
// cut a caller's longer bound short.
func TestAgentFSFreezeTimeouts(t *testing.T) {
	t.Parallel()
	o := buildOptions(nil)
	o.load = func() float64 { return 1 } // an idle host's bounds
	for cmd, want := range map[string]time.Duration{
		"guest-fsfreeze-freeze": 5 * time.Minute,
		"guest-fsfreeze-thaw":   time.Minute,
		"guest-fsfreeze-status": DefaultAgentCommandTimeout,
	} {
		if got := o.timeoutFor(cmd, DefaultAgentCommandTimeout); got != want {
			t.Errorf("agent timeout for %s = %v, want %v", cmd, got, want)
		}
	}
}
