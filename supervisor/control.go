package supervisor

import (
	"context"
	"fmt"
	"net"

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
	lk, err := s.lock(ctx, name, op)
	if err != nil {
		return err
	}
	// (lock settled a migration killed midway: the guest may run on the
	// destination, and a resume here must not make a second copy.)
	defer lk.Unlock()
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if run {
		err = c.Cont(ctx)
	} else {
		err = c.Stop(ctx)
	}
	if err != nil {
		return vmErr(name, fmt.Errorf("%s: %w", op, err))
	}
	qs, err := c.QueryStatus(ctx)
	if err != nil {
		return vmErr(name, fmt.Errorf("%s: confirm: %w", op, err))
	}
	if qs.Running != run {
		return vmErr(name, fmt.Errorf("%s: QEMU reports %q", op, qs.Status))
	}
	return nil
}

// QMP passes one raw QMP command through to the VM's monitor and returns
// QEMU's reply as JSON (error replies included, with a non-nil error).
func (s *Supervisor) QMP(ctx context.Context, name string, command []byte) ([]byte, error) {
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.ExecuteRaw(ctx, command)
}

// ConsoleSocket returns the path of the VM's serial console socket.
func (s *Supervisor) ConsoleSocket(name string) string { return s.paths(name).Console }

// DialConsole connects to the VM's serial console (never through a symlink
// QEMU's user may have put in its place).
func (s *Supervisor) DialConsole(ctx context.Context, name string) (net.Conn, error) {
	c, err := qmp.DialSocket(ctx, s.paths(name).Console)
	if err != nil {
		return nil, vmErr(name, fmt.Errorf("console: %w", err))
	}
	return c, nil
}
