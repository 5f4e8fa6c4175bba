package supervisor

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/vmsup/vmsup/internal/ops/guestagent"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
)

// What vmsup asks of a guest through its agent lives in internal/ops/guestagent;
// here are its Host and the library's API.

// Bounds of the guest agent commands (guestagent).
const (
	DefaultExecTimeout = guestagent.DefaultExecTimeout
	DefaultCopyTimeout = guestagent.DefaultCopyTimeout
	DefaultCopyMax     = guestagent.DefaultCopyMax
	agentTimeout       = guestagent.PingTimeout
)

// The guest agent's types (guestagent).
type (
	ExecResult   = guestagent.ExecResult
	CopyOptions  = guestagent.CopyOptions
	GuestAddress = guestagent.GuestAddress
	AgentStatus  = guestagent.AgentStatus
)

// ErrPaused means the VM's guest is paused: its agent cannot answer.
var ErrPaused = guestagent.ErrPaused

// Exec runs argv in the guest through its agent and waits for it up to
// timeout (DefaultExecTimeout if 0).
func (s *Supervisor) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (ExecResult, error) {
	return s.guest().Exec(ctx, name, argv, timeout)
}

// CopyFromGuest copies the guest's file at path to w, at most o.Max bytes.
func (s *Supervisor) CopyFromGuest(ctx context.Context, name, path string, w io.Writer, o CopyOptions) (int64, error) {
	return s.guest().CopyFrom(ctx, name, path, w, o)
}

// CopyToGuest writes r to the guest's file at path, at most o.Max bytes.
func (s *Supervisor) CopyToGuest(ctx context.Context, name string, r io.Reader, path string, o CopyOptions) (int64, error) {
	return s.guest().CopyTo(ctx, name, r, path, o)
}

// GuestPing asks the VM's guest agent for its ping, version, OS and
// addresses, within a bound.
func (s *Supervisor) GuestPing(ctx context.Context, name string) (AgentStatus, error) {
	return s.guest().Ping(ctx, name)
}

func (s *Supervisor) guest() *guestagent.Guest { return guestagent.New(guestHost{s}) }

// guestHost is the guest agent's Host.
type guestHost struct{ s *Supervisor }

var _ guestagent.Host = guestHost{}

func (h guestHost) View(name string) (*vmstore.View, error) { return h.s.view(name) }
func (h guestHost) NotFound(err error) bool                 { return errors.Is(err, ErrNotFound) }
func (h guestHost) Absent(name string) error                { return h.s.absent(name) }
func (h guestHost) QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	return h.s.qmpSession(ctx, name)
}
func (h guestHost) AgentSession(ctx context.Context, name string) (*qmp.Agent, func(), error) {
	return h.s.agentSession(ctx, name)
}
