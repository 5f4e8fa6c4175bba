package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Bounds of the guest agent commands: the guest answers them, and a
// guest that never does or sends without end must not hold vmsup.
const (
	DefaultExecTimeout = time.Minute
	DefaultCopyTimeout = 5 * time.Minute
	DefaultCopyMax     = 256 << 20 // bytes
	copyChunk          = 4 << 20   // per guest-file-read/-write: base64 stays under qmp.MaxAgentReply
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

// guestAgent runs fn with the VM's guest agent, after checking that the
// VM runs and the guest has the agent's channel open.
func (s *Supervisor) guestAgent(ctx context.Context, name string, fn func(*qmp.Agent) error) error {
	if err := spec.ValidName(name); err != nil {
		return vmErr(name, err)
	}
	v, err := s.view(name)
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotRunning) {
		return s.absent(name)
	}
	if err != nil {
		return vmErr(name, err)
	}
	if !v.Booted.HasGuestAgent() {
		return vmErr(name, errors.New("guest_agent = false: it has no agent channel"))
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return err
	}
	if err := agentCanAnswer(ctx, name, c); err != nil {
		release()
		return err
	}
	open := c.FrontendOpen(ctx, qemuargs.AgentChardevID)
	release()
	if !open {
		return vmErr(name, errors.New("guest agent: the guest has not opened the agent channel (qemu-ga is not running)"))
	}
	a, done, err := s.agentSession(ctx, name)
	if err != nil {
		return vmErr(name, fmt.Errorf("guest agent: %w", err))
	}
	defer done()
	return vmErr(name, fn(a))
}

// Exec runs argv in the guest through its agent (guest-exec) and waits for
// it up to timeout (DefaultExecTimeout if 0).
func (s *Supervisor) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (ExecResult, error) {
	var res ExecResult
	if len(argv) == 0 {
		return res, vmErr(name, errors.New("exec: no command"))
	}
	if timeout <= 0 {
		timeout = DefaultExecTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := s.guestAgent(ctx, name, func(a *qmp.Agent) error {
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

// CopyOptions bound a copy to or from the guest.
type CopyOptions struct {
	Max     int64         // bytes; DefaultCopyMax if 0
	Timeout time.Duration // DefaultCopyTimeout if 0
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

// CopyFromGuest copies the guest's file at path to w (guest-file-read),
// at most o.Max bytes: a bigger file is an error, not a short copy.
func (s *Supervisor) CopyFromGuest(ctx context.Context, name, path string, w io.Writer, o CopyOptions) (int64, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var total int64
	err := s.guestAgent(ctx, name, func(a *qmp.Agent) error {
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

// CopyToGuest writes r to the guest's file at path (created or truncated;
// guest-file-write), at most o.Max bytes. A copy cut short leaves the
// guest's file partly written, as cp does.
func (s *Supervisor) CopyToGuest(ctx context.Context, name string, r io.Reader, path string, o CopyOptions) (int64, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var total int64
	err := s.guestAgent(ctx, name, func(a *qmp.Agent) error {
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

// GuestAddress is one IP address the guest agent reports.
type GuestAddress struct {
	Interface string `json:"interface"`
	MAC       string `json:"mac"`
	Address   string `json:"address"` // with its prefix, "10.0.2.15/24"
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
