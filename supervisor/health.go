package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// The health gate of a restart (apply --restart, up --restart-changed, a
// restart at the guest's reboot): the new QEMU runs, and then the checks of
// the VM's [health] pass within its timeout, or the previous spec comes
// back. The agent is checked when [health] says so, or when it is unset
// and the agent answered before the restart.

// healthPoll is how often the gate looks.
const healthPoll = 500 * time.Millisecond

// maxConsoleScan bounds how much of the console log the gate reads.
const maxConsoleScan = 16 << 20

// healthGate waits for the new guest to pass h. agentBefore: the guest
// agent answered before the restart.
func (s *Supervisor) healthGate(ctx context.Context, sd *units.Manager, name string, h spec.Health, agentBefore bool) error {
	checkAgent := agentBefore
	if h.Agent != nil {
		checkAgent = *h.Agent
	}
	consoleOK, agentOK := h.Console == "", !checkAgent
	if consoleOK && agentOK {
		return nil
	}
	timeout := h.Timeout.D()
	if timeout <= 0 {
		timeout = spec.DefaultHealthTimeout
	}
	gctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if !consoleOK {
			consoleOK = s.consoleHas(name, h.Console)
		}
		if !agentOK {
			pctx, pcancel := context.WithTimeout(gctx, 2*time.Second)
			st, err := s.GuestPing(pctx, name)
			pcancel()
			agentOK = err == nil && st.Responding
		}
		if consoleOK && agentOK {
			return nil
		}
		if st, err := sd.Status(ctx, s.state.UnitOf(name)); err == nil && st.Gone() {
			return fmt.Errorf("health gate: QEMU exited (%s): %s", orDefault(st.ExitReason(), st.ActiveState),
				s.lastWords(ctx, s.state.UnitOf(name)))
		}
		select {
		case <-gctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var failed []string
			if !agentOK {
				failed = append(failed, "the guest agent did not answer")
			}
			if !consoleOK {
				failed = append(failed, fmt.Sprintf("the console did not print %q", h.Console))
			}
			return fmt.Errorf("health gate failed: within %s %s", timeout, strings.Join(failed, " and "))
		case <-time.After(healthPoll):
		}
	}
}

// consoleHas reports whether the console log of this QEMU's run holds
// marker.
func (s *Supervisor) consoleHas(name, marker string) bool {
	// The current file only: a fresh start's logger began it (NewRun), so
	// the previous guest's lines are not in it.
	f, err := os.Open(s.paths(name).ConsoleLog)
	if err != nil {
		return false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, maxConsoleScan))
	return bytes.Contains(b, []byte(marker))
}

// agentAnswers reports whether the VM's guest agent answers now (bounded:
// GuestPing's own 0.7 s).
func (s *Supervisor) agentAnswers(ctx context.Context, name string) bool {
	st, err := s.GuestPing(ctx, name)
	return err == nil && st.Responding
}
