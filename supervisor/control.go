package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/vmsup/vmsup/internal/qmppolicy"
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
		err = s.resumePanicked(ctx, name, c)
		if err == nil {
			err = c.Cont(ctx)
		}
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

// resumePanicked readies a guest its panic stopped for cont: QEMU needs a
// reset first (on_panic "pause"); on_panic "preserve" refuses, the guest is
// kept as it panicked until down or restart.
func (s *Supervisor) resumePanicked(ctx context.Context, name string, c *qmp.Conn) error {
	qs, err := c.QueryStatus(ctx)
	if err != nil || qs.Status != "guest-panicked" {
		return err
	}
	if v, err := s.view(name); err == nil && v.Booted.OnPanic == spec.PanicPreserve {
		return ErrPreserved
	}
	return c.SystemReset(ctx)
}

// QMP passes one raw QMP command through to the VM's monitor and returns
// QEMU's reply as JSON (error replies included, with a non-nil error).
// Commands that would take QEMU outside its confinement or kill it are
// refused (internal/qmppolicy) unless unsafe; every command, passed or
// not, is logged (qmpAudit).
func (s *Supervisor) QMP(ctx context.Context, name string, command []byte, unsafe bool) ([]byte, error) {
	if err := spec.ValidName(name); err != nil {
		return nil, vmErr(name, err)
	}
	if _, err := os.Stat(s.paths(name).Records); err != nil {
		return nil, s.notFound(name) // nothing to send to, nothing to log
	}
	verdict := "passed"
	perr := qmppolicy.Check(command, s.paths(name).Dir)
	switch {
	case perr != nil && unsafe:
		verdict = "passed (--unsafe: " + perr.Error() + ")"
	case perr != nil:
		verdict = "refused"
	}
	if err := s.qmpAudit(name, verdict, command); err != nil {
		return nil, vmErr(name, fmt.Errorf("qmp: log: %w (the command was not sent)", err))
	}
	if perr != nil && !unsafe {
		return nil, vmErr(name, fmt.Errorf("qmp: %w", perr))
	}
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.ExecuteRaw(ctx, command)
}

// qmpAudit logs a raw QMP command: to the VM's records (root only,
// ROOT/records/NAME/qmp.log, one JSON line each, the previous MiB kept as
// qmp.log.1) and to the systemd journal where one listens.
func (s *Supervisor) qmpAudit(name, verdict string, command []byte) error {
	p := s.paths(name)
	if err := p.MakeRecords(); err != nil {
		return err
	}
	line, err := json.Marshal(struct {
		Time    time.Time       `json:"time"`
		PID     int             `json:"pid"`
		UID     int             `json:"uid"`
		Verdict string          `json:"verdict"`
		Command json.RawMessage `json:"command"`
	}{time.Now().UTC(), os.Getpid(), os.Getuid(), verdict, compactJSON(command)})
	if err != nil {
		return err
	}
	log := filepath.Join(p.Records, "qmp.log")
	if fi, err := os.Stat(log); err == nil && fi.Size() > 1<<20 {
		_ = os.Rename(log, log+".1")
	}
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		return err
	}
	if journal.Enabled() {
		_ = journal.Send("vmsup qmp "+name+": "+verdict+": "+string(compactJSON(command)), journal.PriInfo,
			map[string]string{"VMSUP_VM": name, "VMSUP_QMP_VERDICT": verdict})
	}
	return nil
}

// compactJSON is the command as one line (as sent, if it is not JSON).
func compactJSON(b []byte) json.RawMessage {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		q, _ := json.Marshal(string(b))
		return q
	}
	return buf.Bytes()
}

// ConsoleSocket returns the path of the VM's serial console socket.
func (s *Supervisor) ConsoleSocket(name string) string { return s.paths(name).Console }

// DialConsole connects to the VM's serial console (never through a symlink
// QEMU's user may have put in its place).
func (s *Supervisor) DialConsole(ctx context.Context, name string) (net.Conn, error) {
	c, err := qmp.DialSocket(ctx, s.paths(name).Console)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, s.absent(name)
	}
	if err != nil {
		return nil, vmErr(name, fmt.Errorf("console: %w", err))
	}
	return c, nil
}
