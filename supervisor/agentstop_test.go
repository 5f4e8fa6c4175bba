package supervisor_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// TestAgentShutdown: with shutdown = "agent", down and systemctl stop ask
// qemu-ga for guest-shutdown (not the ACPI button) and the guest powers off;
// status reports the guest ping meanwhile.
func TestAgentShutdown(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	sup := newSup(t, "")
	f := guestFile(t, t.TempDir(), "agentstop", `shutdown = "agent"`)
	agentUp := func() supervisor.Status {
		t.Helper()
		if _, err := sup.Up(ctx, f); err != nil {
			t.Fatal(err)
		}
		st, _ := sup.Status(ctx, "agentstop")
		waitConsole(t, st, "VMSUP-SHELL-READY", time.Minute)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			a, err := sup.GuestPing(ctx, "agentstop")
			if err == nil && a.Responding {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("guest agent never answered: %+v %v", a, err)
			}
		}
		st, _ = sup.Status(ctx, "agentstop")
		if st.GuestAgent == nil || !st.GuestAgent.Responding || !strings.HasPrefix(st.GuestAgent.Version, "7.2") {
			t.Fatalf("status guest ping: %+v", st.GuestAgent)
		}
		return st
	}
	st := agentUp()
	dr, err := sup.Down(ctx, "agentstop")
	if err != nil || dr.Step != supervisor.StoppedAgent {
		t.Fatalf("down: %+v %v (want agent)", dr, err)
	}
	waitConsole(t, st, "reboot: Power down", 5*time.Second)

	st = agentUp()
	if out, err := env.Systemd.Systemctl(ctx, "stop", "vmsup-agentstop.service"); err != nil {
		t.Fatalf("systemctl stop: %v\n%s", err, out)
	}
	waitConsole(t, st, "reboot: Power down", 5*time.Second)
	if journal, _ := env.Systemd.Journal(ctx, "vmsup-agentstop.service"); !strings.Contains(journal, "vmsup stop-hook agentstop: agent") {
		t.Fatalf("stop hook did not use the agent; journal:\n%s", tail(journal, 3000))
	}
}
