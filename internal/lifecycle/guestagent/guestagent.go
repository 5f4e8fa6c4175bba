// Package guestagent runs what vmsup asks of a guest through its agent
// (qemu-ga over the VM's virtio-serial channel): a command (guest-exec), a
// file copied in or out (guest-file-*), a ping with the guest's version,
// OS and addresses. It checks first that the VM runs its guest and that the
// guest opened the agent's channel, so a guest that cannot answer is named
// at once instead of timing out. The sessions (one client at a time) are
// the supervisor's, behind Host.
package guestagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Host is what the guest agent's commands need of the supervisor.
type Host interface {
	// View is the VM's running view (nil without a record).
	View(name string) (*vmstore.View, error)
	// NotFound reports whether err says the VM has no record.
	NotFound(err error) bool
	// Absent is the error for a VM that has no QEMU running: no such VM,
	// or not running.
	Absent(name string) error
	// QMPSession and AgentSession connect to the VM's monitor and its
	// guest agent, one client at a time (release when done).
	QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error)
	AgentSession(ctx context.Context, name string) (*qmp.Agent, func(), error)
}

// Guest runs the agent's commands for a supervisor.
type Guest struct{ h Host }

// New returns the guest agent's commands over h.
func New(h Host) *Guest { return &Guest{h: h} }

// Bounds of the guest agent commands: the guest answers them, and a
// guest that never does or sends without end must not hold vmsup.
const (
	DefaultExecTimeout = time.Minute
	DefaultCopyTimeout = 5 * time.Minute
	DefaultCopyMax     = 256 << 20 // bytes
	copyChunk          = 4 << 20   // per guest-file-read/-write: base64 stays under qmp.MaxAgentReply
	// PingTimeout bounds status's guest ping: a guest without a running
	// agent must not slow status down for long (Proxmox's agent waits that
	// hang automation are the complaint to avoid).
	PingTimeout = 700 * time.Millisecond
)

// ExecResult is what a command run in the guest returned. qemu-ga keeps at
// most 16 MiB of each output; Truncated says it cut one.
type ExecResult struct {
	ExitCode  int    `json:"exit_code"`
	Signal    int    `json:"signal,omitempty"`
	Stdout    []byte `json:"stdout"`
	Stderr    []byte `json:"stderr"`
	Truncated bool   `json:"truncated"`
}

// CopyOptions bound a copy to or from the guest.
type CopyOptions struct {
	Max     int64         // bytes; DefaultCopyMax if 0
	Timeout time.Duration // DefaultCopyTimeout if 0
}

// GuestAddress is one IP address the guest agent reports.
type GuestAddress struct {
	Interface string `json:"interface"`
	MAC       string `json:"mac"`
	Address   string `json:"address"` // with its prefix, "10.0.2.15/24"
}

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

// ErrPaused means the VM's guest is paused (vmsup pause): its guest agent
// cannot answer until it is resumed.
var ErrPaused = errors.New("paused")

// withAgent runs fn with the VM's guest agent, after checking that the
// VM runs and the guest has the agent's channel open.
func (g *Guest) withAgent(ctx context.Context, name string, fn func(*qmp.Agent) error) error {
	if err := spec.ValidName(name); err != nil {
		return vmerr.Wrap(name, err)
	}
	v, err := g.h.View(name)
	if v == nil && err != nil && !g.h.NotFound(err) {
		return vmerr.Wrap(name, err) // its records could not be read
	}
	if v == nil || !v.Running {
		return g.h.Absent(name)
	}
	if !v.Booted.HasGuestAgent() {
		return vmerr.Wrap(name, errors.New("guest_agent = false: it has no agent channel"))
	}
	c, release, err := g.h.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	if err := CanAnswer(ctx, name, c); err != nil {
		release()
		return err
	}
	open := c.FrontendOpen(ctx, qemuargs.AgentChardevID)
	release()
	if !open {
		return vmerr.Wrap(name, errors.New("guest agent: the guest has not opened the agent channel (qemu-ga is not running)"))
	}
	a, done, err := g.h.AgentSession(ctx, name)
	if err != nil {
		return vmerr.Wrap(name, fmt.Errorf("guest agent: %w", err))
	}
	defer done()
	return vmerr.Wrap(name, fn(a))
}

// Exec runs argv in the guest through its agent (guest-exec) and waits for
// it up to timeout (DefaultExecTimeout if 0).
func (g *Guest) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (ExecResult, error) {
	var res ExecResult
	if len(argv) == 0 {
		return res, vmerr.Wrap(name, errors.New("exec: no command"))
	}
	if timeout <= 0 {
		timeout = DefaultExecTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := g.withAgent(ctx, name, func(a *qmp.Agent) error {
		pid, err := a.Exec(ctx, argv[0], argv[1:], true)
		if err != nil {
			return fmt.Errorf("exec %s: %w", argv[0], err)
		}
		st, err := a.ExecWait(ctx, pid, 50*time.Millisecond)
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("exec %s: still running after %s (left running in the guest, pid %d)", argv[0], timeout, pid)
		}
		if err != nil {
			return fmt.Errorf("exec %s: %w", argv[0], err)
		}
		res.Stdout, res.Stderr = st.Stdout, st.Stderr
		res.Truncated = st.StdoutTruncated || st.StderrTruncated
		if st.ExitCode != nil {
			res.ExitCode = *st.ExitCode
		}
		if st.Signal != nil {
			res.Signal = *st.Signal
			res.ExitCode = 128 + *st.Signal
		}
		return nil
	})
	return res, err
}

func (o CopyOptions) withDefaults() CopyOptions {
	if o.Max <= 0 {
		o.Max = DefaultCopyMax
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultCopyTimeout
	}
	return o
}

// CopyFrom copies the guest's file at path to w (guest-file-read),
// at most o.Max bytes: a bigger file is an error, not a short copy.
func (g *Guest) CopyFrom(ctx context.Context, name, path string, w io.Writer, o CopyOptions) (int64, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var total int64
	err := g.withAgent(ctx, name, func(a *qmp.Agent) error {
		h, err := a.FileOpen(ctx, path, "r")
		if err != nil {
			return fmt.Errorf("cp: open %s in the guest: %w", path, err)
		}
		defer a.FileClose(context.WithoutCancel(ctx), h)
		for {
			b, eof, err := a.FileRead(ctx, h, copyChunk)
			if err != nil {
				return fmt.Errorf("cp: read %s in the guest: %w", path, err)
			}
			if total+int64(len(b)) > o.Max {
				return fmt.Errorf("cp: %s in the guest is larger than %d bytes (raise the bound to copy it)", path, o.Max)
			}
			if _, err := w.Write(b); err != nil {
				return fmt.Errorf("cp: %w", err)
			}
			total += int64(len(b))
			if eof || len(b) == 0 {
				return nil
			}
		}
	})
	return total, err
}

// CopyTo writes r to the guest's file at path (created or truncated;
// guest-file-write), at most o.Max bytes. A copy cut short leaves the
// guest's file partly written, as cp does.
func (g *Guest) CopyTo(ctx context.Context, name string, r io.Reader, path string, o CopyOptions) (int64, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var total int64
	err := g.withAgent(ctx, name, func(a *qmp.Agent) error {
		h, err := a.FileOpen(ctx, path, "w")
		if err != nil {
			return fmt.Errorf("cp: open %s in the guest: %w", path, err)
		}
		buf := make([]byte, copyChunk)
		for {
			n, rerr := io.ReadFull(r, buf)
			if total+int64(n) > o.Max {
				a.FileClose(ctx, h)
				return fmt.Errorf("cp: more than %d bytes to copy (raise the bound)", o.Max)
			}
			for off := 0; off < n; {
				m, err := a.FileWrite(ctx, h, buf[off:n])
				if err != nil || m <= 0 {
					a.FileClose(ctx, h)
					return fmt.Errorf("cp: write %s in the guest: %w", path, cmpErr(err, "no progress"))
				}
				off += m
			}
			total += int64(n)
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
				break
			}
			if rerr != nil {
				a.FileClose(ctx, h)
				return fmt.Errorf("cp: %w", rerr)
			}
		}
		if err := a.FileClose(ctx, h); err != nil {
			return fmt.Errorf("cp: close %s in the guest: %w", path, err)
		}
		return nil
	})
	return total, err
}

func cmpErr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}

// guestAddrs flattens the agent's interfaces into addresses, loopback left out.
func guestAddrs(ifs []qmp.GuestInterface) []GuestAddress {
	var out []GuestAddress
	for _, i := range ifs {
		if i.Name == "lo" {
			continue
		}
		for _, ad := range i.Addresses {
			out = append(out, GuestAddress{Interface: i.Name, MAC: i.MAC, Address: fmt.Sprintf("%s/%d", ad.Address, ad.Prefix)})
		}
	}
	return out
}

// Ping asks the VM's guest agent for guest-ping, guest-info and
// guest-get-osinfo, all within PingTimeout. One client at a time: QEMU
// serves the agent's channel to one connection, so callers take turns
// through a lock instead of timing out in its backlog.
func (g *Guest) Ping(ctx context.Context, name string) (AgentStatus, error) {
	if err := spec.ValidName(name); err != nil {
		return AgentStatus{}, vmerr.Wrap(name, err)
	}
	c, release, err := g.h.QMPSession(ctx, name)
	if err != nil {
		return AgentStatus{}, err
	}
	defer release()
	return g.PingOn(ctx, name, c)
}

// PingOn is Ping over the VM's open monitor c, which first tells
// whether the guest has the agent's port open at all (qemu-ga running):
// if not, there is nothing to wait for.
func (g *Guest) PingOn(ctx context.Context, name string, c *qmp.Conn) (AgentStatus, error) {
	v, err := g.h.View(name)
	if err != nil {
		return AgentStatus{}, vmerr.Wrap(name, err)
	}
	if !v.Booted.HasGuestAgent() {
		return AgentStatus{}, vmerr.Wrap(name, errors.New("guest_agent = false: it has no agent channel"))
	}
	if err := CanAnswer(ctx, name, c); err != nil {
		return AgentStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	fail := func(err error) (AgentStatus, error) {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s (is qemu-ga running in the guest?)", PingTimeout)
		}
		return AgentStatus{Error: err.Error()}, nil
	}
	if !c.FrontendOpen(ctx, qemuargs.AgentChardevID) {
		return AgentStatus{Error: "the guest has not opened the agent channel (qemu-ga is not running)"}, nil
	}
	start := time.Now()
	a, done, err := g.h.AgentSession(ctx, name)
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

// CanAnswer says why the guest agent cannot answer now, if QEMU (on
// its monitor c) does not run the guest: paused, suspended, migrating.
// Asking would only wait for the agent's timeout.
func CanAnswer(ctx context.Context, name string, c *qmp.Conn) error {
	qs, err := c.QueryStatus(ctx)
	switch {
	case err != nil || qs.Running:
		return nil // the agent's own answer (or timeout) says more
	case qs.Status == qmp.RunPaused:
		return vmerr.Wrap(name, fmt.Errorf("%w: the guest agent cannot answer while the VM is paused (vmsup resume %s)", ErrPaused, name))
	}
	return vmerr.Wrap(name, fmt.Errorf("the guest agent cannot answer while the guest does not run (QEMU status %q)", qs.Status))
}
