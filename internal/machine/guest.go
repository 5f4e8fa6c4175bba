package machine

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/guestagent"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
)

// What vmsup asks of a guest through its agent lives in internal/lifecycle/guestagent;
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
func (s *Env) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (ExecResult, error) {
	return s.Guest().Exec(ctx, name, argv, timeout)
}

// CopyFromGuest copies the guest's file at path to w, at most o.Max bytes.
func (s *Env) CopyFromGuest(ctx context.Context, name, path string, w io.Writer, o CopyOptions) (int64, error) {
	return s.Guest().CopyFrom(ctx, name, path, w, o)
}

// CopyToGuest writes r to the guest's file at path, at most o.Max bytes.
func (s *Env) CopyToGuest(ctx context.Context, name string, r io.Reader, path string, o CopyOptions) (int64, error) {
	return s.Guest().CopyTo(ctx, name, r, path, o)
}

// GuestPing asks the VM's guest agent for its ping, version, OS and
// addresses, within a bound.
func (s *Env) GuestPing(ctx context.Context, name string) (AgentStatus, error) {
	return s.Guest().Ping(ctx, name)
}

func (s *Env) Guest() *guestagent.Guest { return guestagent.New(guestHost{s}) }

// guestHost is the guest agent's Host.
type guestHost struct{ s *Env }

var _ guestagent.Host = guestHost{}

func (h guestHost) View(name string) (*vmstore.View, error) { return h.s.View(name) }
func (h guestHost) NotFound(err error) bool                 { return errors.Is(err, ErrNotFound) }
func (h guestHost) Absent(name string) error                { return h.s.Absent(name) }
func (h guestHost) QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	return h.s.QMPSession(ctx, name)
}
func (h guestHost) AgentSession(ctx context.Context, name string) (*qmp.Agent, func(), error) {
	return h.s.AgentSession(ctx, name)
}
