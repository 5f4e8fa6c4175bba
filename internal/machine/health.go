package machine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/host/caps"
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
// agent answered before the restart. accel: what the new QEMU runs under,
// which sizes an unset timeout (caps.HealthTimeout). waiting, when
// set, is told what the gate still waits for each time it looks.
func (s *Env) healthGate(ctx context.Context, sd *units.Manager, name string, h spec.Health, accel spec.Accel, agentBefore bool, waiting GateWaiting) error {
	checkAgent := agentBefore
	if h.Agent != nil {
		checkAgent = *h.Agent
	}
	consoleOK, agentOK := h.Console == "", !checkAgent
	if consoleOK && agentOK {
		return nil
	}
	timeout := caps.HealthTimeout(h.Timeout.D(), accel, caps.LoadFactor())
	gctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
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
		if waiting != nil {
			waiting(time.Since(start), timeout, gateWaitsFor(h, consoleOK, agentOK))
		}
		if st, err := sd.Status(ctx, s.state.UnitOf(name)); err == nil && st.Gone() {
			return fmt.Errorf("health gate: QEMU exited (%s): %s", orDefault(st.ExitReason(), st.ActiveState),
				s.LastWords(ctx, s.state.UnitOf(name)))
		}
		select {
		case <-gctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("health gate failed: within %s %s", timeout, gateFailed(h, consoleOK, agentOK))
		case <-time.After(healthPoll):
		}
	}
}

// gateWaitsFor says what the gate still waits for; gateFailed, what did
// not happen in time.
func gateWaitsFor(h spec.Health, consoleOK, agentOK bool) string {
	return gateWords(h, consoleOK, agentOK, "the guest agent to answer", "the console to print %q")
}

func gateFailed(h spec.Health, consoleOK, agentOK bool) string {
	return gateWords(h, consoleOK, agentOK, "the guest agent did not answer", "the console did not print %q")
}

func gateWords(h spec.Health, consoleOK, agentOK bool, agent, console string) string {
	var out []string
	if !agentOK {
		out = append(out, agent)
	}
	if !consoleOK {
		out = append(out, fmt.Sprintf(console, h.Console))
	}
	return strings.Join(out, " and ")
}

// consoleHas reports whether the console log of this QEMU's run holds
// marker.
func (s *Env) consoleHas(name, marker string) bool {
	// The current file only: a fresh start's logger began it (NewRun), so
	// the previous guest's lines are not in it.
	f, err := os.Open(s.Paths(name).ConsoleLog)
	if err != nil {
		return false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, maxConsoleScan))
	return bytes.Contains(b, []byte(marker))
}

// agentAnswers reports whether the VM's guest agent answers now (bounded:
// GuestPing's own 0.7 s).
func (s *Env) agentAnswers(ctx context.Context, name string) bool {
	st, err := s.GuestPing(ctx, name)
	return err == nil && st.Responding
}
