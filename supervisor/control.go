package supervisor

import (
	"context"
	"errors"
	"fmt"
	"image"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/console/display"
	"github.com/vmsup/vmsup/internal/ops/qmppolicy"
	"github.com/vmsup/vmsup/internal/ops/qmppolicy/qmpfds"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"

	"github.com/vmsup/vmsup/qmp"
)

// Pause stops the guest's vCPUs (QMP stop) and confirms QEMU reports paused.
func (s *Supervisor) Pause(ctx context.Context, name string) error {
	return s.runState(ctx, name, "pause", false)
}

// Resume restarts the guest's vCPUs (QMP cont) and confirms it runs.
func (s *Supervisor) Resume(ctx context.Context, name string) error {
	return s.runState(ctx, name, "resume", true)
}

func (s *Supervisor) runState(ctx context.Context, name, op string, run bool) error {
	lk, err := s.env.Lock(ctx, name, op)
	if err != nil {
		return err
	}
	// (lock settled a migration killed midway: the guest may run on the
	// destination, and a resume here must not make a second copy.)
	defer lk.Unlock()
	c, release, err := s.env.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if run {
		err = s.resumePanicked(ctx, name, c)
		if err == nil {
			err = c.Cont(ctx)
		}
	} else {
		err = c.Stop(ctx)
	}
	if err != nil {
		return vmerr.Wrap(name, fmt.Errorf("%s: %w", op, err))
	}
	qs, err := c.QueryStatus(ctx)
	if err != nil {
		return vmerr.Wrap(name, fmt.Errorf("%s: confirm: %w", op, err))
	}
	if qs.Running != run {
		return vmerr.Wrap(name, fmt.Errorf("%s: QEMU reports %q", op, qs.Status))
	}
	return nil
}

// resumePanicked readies a guest its panic stopped for cont: QEMU needs a
// reset first (on_panic "pause"); on_panic "preserve" refuses, the guest is
// kept as it panicked until down or restart.
func (s *Supervisor) resumePanicked(ctx context.Context, name string, c *qmp.Conn) error {
	qs, err := c.QueryStatus(ctx)
	if err != nil || qs.Status != qmp.RunGuestPanicked {
		return err
	}
	if v, err := s.env.View(name); err == nil && v.Booted.OnPanic == spec.PanicPreserve {
		return ErrPreserved
	}
	return c.SystemReset(ctx)
}

// QMP passes one raw QMP command through to the VM's monitor and returns
// QEMU's reply as JSON (error replies included, with a non-nil error).
// Only commands on the allow-list (internal/ops/qmppolicy, docs/qmp-policy.md)
// pass, unless unsafe; every command is logged first (qmpAudit), refused
// and unsafe ones in a security log of their own, and one that cannot be
// logged is not sent. A passed command's state-directory files go to QEMU
// as descriptors vmsup opened (qmpfiles.go), never as names. A refusal is
// a *qmppolicy.Refusal.
func (s *Supervisor) QMP(ctx context.Context, name string, command []byte, unsafe bool) ([]byte, error) {
	if err := spec.ValidName(name); err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	if _, err := os.Stat(s.env.Paths(name).Records); err != nil {
		return nil, s.env.NotFound(name) // nothing to send to, nothing to log
	}
	d, err := qmppolicy.Decide(command, s.qmpEnv(name))
	var c *qmp.Conn
	var files *qmpfds.Files
	if err == nil && len(d.Files) > 0 {
		conn, release, serr := s.env.QMPSession(ctx, name)
		if serr != nil {
			return nil, serr
		}
		defer release()
		c = conn
		if files, err = s.openRawFiles(ctx, name, c, d); files != nil {
			defer files.Close()
		} else if _, ok := isRefusal(err); !ok {
			return nil, err
		}
	}
	verdict := qmppolicy.Passed
	var refusal *qmppolicy.Refusal
	if err != nil {
		var ok bool
		if refusal, ok = isRefusal(err); !ok {
			refusal = &qmppolicy.Refusal{Class: qmppolicy.Malformed, Reason: err.Error()}
		}
		verdict = qmppolicy.Refused
		if unsafe {
			verdict = qmppolicy.Unsafe
		}
	}
	if err := s.qmpAudit(ctx, name, verdict, refusal, command); err != nil {
		return nil, vmerr.Wrap(name, fmt.Errorf("qmp: log: %w (the command was not sent)", err))
	}
	if verdict == qmppolicy.Refused {
		return nil, vmerr.Wrap(name, fmt.Errorf("qmp: %w", refusal))
	}
	if c == nil {
		conn, release, err := s.env.QMPSession(ctx, name)
		if err != nil {
			return nil, err
		}
		defer release()
		c = conn
	}
	switch {
	case verdict == qmppolicy.Unsafe:
		return c.ExecuteRaw(ctx, command)
	case files != nil:
		return qmpfds.Execute(ctx, c, d, files)
	}
	// What was checked is what is sent: block options in their expanded form.
	cmd, err := d.Encode()
	if err != nil {
		return nil, vmerr.Wrap(name, fmt.Errorf("qmp: %s: encode: %w", d.Command.Execute, err))
	}
	return c.ExecuteRaw(ctx, cmd)
}

// ConsoleSocket returns the path of the VM's serial console socket.
func (s *Supervisor) ConsoleSocket(name string) string { return s.env.Paths(name).Console }

// DialConsole connects to the VM's serial console (never through a symlink
// QEMU's user may have put in its place).
func (s *Supervisor) DialConsole(ctx context.Context, name string) (net.Conn, error) {
	c, err := qmp.DialSocket(ctx, s.env.Paths(name).Console)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, s.env.Absent(name)
	}
	if err != nil {
		return nil, vmerr.Wrap(name, fmt.Errorf("console: %w", err))
	}
	return c, nil
}

// displayVM is the running VM's booted spec when it has a [display] (and,
// if vnc, its VNC server).
func (s *Supervisor) displayVM(name string, vnc bool) (*spec.VM, error) {
	v, err := s.env.View(name)
	if errors.Is(err, ErrNotRunning) {
		return nil, vmerr.Wrap(name, ErrNotRunning)
	}
	if err != nil {
		return nil, err
	}
	switch d := v.Booted.Display; {
	case vnc && !d.HasVNC():
		return nil, vmerr.Wrap(name, errors.New("no VNC server ([display] with vnc = true)"))
	case !vnc && !d.HasVideo():
		return nil, vmerr.Wrap(name, display.ErrNoDisplay)
	}
	return v.Booted, nil
}

// Screenshot is the VM's screen now (internal/console/display.Screenshot).
func (s *Supervisor) Screenshot(ctx context.Context, name string) (*image.RGBA, error) {
	if _, err := s.displayVM(name, false); err != nil {
		return nil, err
	}
	c, release, err := s.env.QMPSession(ctx, name)
	if err != nil {
		return nil, err
	}
	defer release()
	img, err := display.Screenshot(ctx, c, s.env.Paths(name).Dir)
	if err != nil {
		return nil, vmerr.Wrap(name, fmt.Errorf("screenshot: %w", err))
	}
	return img, nil
}

// DialVNC connects to the VM's VNC server's socket (never through a
// symlink) for one client's session.
func (s *Supervisor) DialVNC(ctx context.Context, name string) (net.Conn, error) {
	if _, err := s.displayVM(name, true); err != nil {
		return nil, err
	}
	conn, err := qmp.DialSocket(ctx, s.env.Paths(name).VNC())
	if err != nil {
		return nil, vmerr.Wrap(name, fmt.Errorf("vnc: %w", err))
	}
	return conn, nil
}

// VNCTicket gives a VM whose VNC server asks for a password
// (display.password) a fresh one a client must log in with within ttl
// (internal/console/display.Ticket); "" for a VM whose server asks for none.
func (s *Supervisor) VNCTicket(ctx context.Context, name string, ttl time.Duration) (string, error) {
	vm, err := s.displayVM(name, true)
	if err != nil || !vm.Display.Password {
		return "", err
	}
	c, release, err := s.env.QMPSession(ctx, name)
	if err != nil {
		return "", err
	}
	defer release()
	pw, err := display.Ticket(ctx, c, ttl)
	if err != nil {
		return "", vmerr.Wrap(name, fmt.Errorf("vnc: %w", err))
	}
	return pw, nil
}

// openRawFiles opens the files a passed raw command names, as QEMU's user
// (package qmpfds).
func (s *Supervisor) openRawFiles(ctx context.Context, name string, c *qmp.Conn, d *qmppolicy.Decision) (*qmpfds.Files, error) {
	p := s.env.Paths(name)
	pid := vmstore.QEMUPID(name, p.QMP)
	if pid <= 0 {
		return nil, vmerr.Wrap(name, fmt.Errorf("qmp: QEMU's process, whose user opens the command's files: %w", ErrNotRunning))
	}
	f, err := qmpfds.Open(ctx, c, p.Dir, pid, d)
	if _, ok := isRefusal(err); err != nil && !ok {
		return nil, vmerr.Wrap(name, err)
	}
	return f, err
}

// isRefusal reports whether err is a policy refusal, and gives it.
func isRefusal(err error) (*qmppolicy.Refusal, bool) {
	var r *qmppolicy.Refusal
	return r, errors.As(err, &r)
}
