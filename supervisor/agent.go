package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// agentTimeout bounds status's guest ping: a guest without a running agent
// must not slow status down for long (Proxmox's agent waits that hang
// automation are the complaint to avoid).
const agentTimeout = 700 * time.Millisecond

// AgentStatus is the guest ping status reports: whether qemu-ga answers in
// the guest, and what it says of itself.
type AgentStatus struct {
	Responding bool    `json:"responding"`
	Version    string  `json:"version,omitempty"`
	OS         string  `json:"os,omitempty"`
	PingMillis float64 `json:"ping_ms,omitempty"`
	Error      string  `json:"error,omitempty"`
	// Addresses are the guest's IP addresses (loopback left out).
	Addresses []GuestAddress `json:"addresses,omitempty"`
}

// GuestPing asks the VM's guest agent for guest-ping, guest-info and
// guest-get-osinfo, all within agentTimeout. One client at a time: QEMU
// serves the agent's channel to one connection, so callers take turns
// through a lock instead of timing out in its backlog.
func (s *Supervisor) GuestPing(ctx context.Context, name string) (AgentStatus, error) {
	if err := spec.ValidName(name); err != nil {
		return AgentStatus{}, vmErr(name, err)
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return AgentStatus{}, err
	}
	defer release()
	return s.guestPing(ctx, name, c)
}

// guestPing is GuestPing over the VM's open monitor c, which first tells
// whether the guest has the agent's port open at all (qemu-ga running):
// if not, there is nothing to wait for.
func (s *Supervisor) guestPing(ctx context.Context, name string, c *qmp.Conn) (AgentStatus, error) {
	v, err := s.view(name)
	if err != nil {
		return AgentStatus{}, vmErr(name, err)
	}
	if !v.Booted.HasGuestAgent() {
		return AgentStatus{}, vmErr(name, errors.New("guest_agent = false: it has no agent channel"))
	}
	if err := agentCanAnswer(ctx, name, c); err != nil {
		return AgentStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	fail := func(err error) (AgentStatus, error) {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s (is qemu-ga running in the guest?)", agentTimeout)
		}
		return AgentStatus{Error: err.Error()}, nil
	}
	if !c.FrontendOpen(ctx, qemuargs.AgentChardevID) {
		return AgentStatus{Error: "the guest has not opened the agent channel (qemu-ga is not running)"}, nil
	}
	start := time.Now()
	a, done, err := s.agentSession(ctx, name)
	if err != nil {
		return fail(err)
	}
	defer done()
	if err := a.Ping(ctx); err != nil {
		return fail(err)
	}
	st := AgentStatus{Responding: true, PingMillis: float64(time.Since(start).Microseconds()) / 1000}
	st.Version, st.OS = a.Describe(ctx)
	if ifs, err := a.NetworkInterfaces(ctx); err == nil {
		st.Addresses = guestAddrs(ifs)
	}
	return st, nil
}

// ErrPaused means the VM's guest is paused (vmsup pause): its guest agent
// cannot answer until it is resumed.
var ErrPaused = errors.New("paused")

// agentCanAnswer says why the guest agent cannot answer now, if QEMU (on
// its monitor c) does not run the guest: paused, suspended, migrating.
// Asking would only wait for the agent's timeout.
func agentCanAnswer(ctx context.Context, name string, c *qmp.Conn) error {
	qs, err := c.QueryStatus(ctx)
	switch {
	case err != nil || qs.Running:
		return nil // the agent's own answer (or timeout) says more
	case qs.Status == "paused":
		return vmErr(name, fmt.Errorf("%w: the guest agent cannot answer while the VM is paused (vmsup resume %s)", ErrPaused, name))
	}
	return vmErr(name, fmt.Errorf("the guest agent cannot answer while the guest does not run (QEMU status %q)", qs.Status))
}

// agentSession connects to the VM's guest agent, one client at a time.
func (s *Supervisor) agentSession(ctx context.Context, name string) (*qmp.Agent, func(), error) {
	p := s.paths(name)
	if err := p.MakeRecords(); err != nil {
		return nil, nil, err
	}
	lk, ok, err := vmstate.LockFile(ctx, p.AgentLock(), true)
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
func (s *Supervisor) agentShutdown(ctx context.Context, name string, c *qmp.Conn, mode string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*agentTimeout)
	defer cancel()
	if !c.FrontendOpen(ctx, qemuargs.AgentChardevID) {
		return false
	}
	a, done, err := s.agentSession(ctx, name)
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
