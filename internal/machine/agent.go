package machine

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
)

// AgentSession connects to the VM's guest agent, one client at a time.
func (s *Env) AgentSession(ctx context.Context, name string) (*qmp.Agent, func(), error) {
	p := s.Paths(name)
	if err := p.MakeRecords(); err != nil {
		return nil, nil, err
	}
	lk, ok, err := vmstore.LockFile(ctx, p.AgentLock(), true)
	if err != nil {
		return nil, nil, fmt.Errorf("agent lock: %w", err)
	}
	if !ok {
		return nil, nil, errors.New("another vmsup command is talking to the agent")
	}
	a, err := qmp.DialAgent(ctx, p.Agent, qmp.WithoutSymlink(), qmp.WithConnectTimeout(agentTimeout))
	if err != nil {
		lk.Unlock()
		return nil, nil, err
	}
	return a, func() { a.Close(); lk.Unlock() }, nil
}

// agentShutdown asks qemu-ga for guest-shutdown in mode ("powerdown" or
// "reboot") if it answers a ping; false means it was not asked (no agent,
// or it did not answer).
func (s *Env) agentShutdown(ctx context.Context, name string, c *qmp.Conn, mode string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*agentTimeout)
	defer cancel()
	if !c.FrontendOpen(ctx, qemuargs.AgentChardevID) {
		return false
	}
	a, done, err := s.AgentSession(ctx, name)
	if err != nil {
		return false
	}
	defer done()
	if a.Ping(ctx) != nil {
		return false
	}
	// qemu-ga answers guest-shutdown only on failure.
	return a.Shutdown(ctx, mode) == nil
}
