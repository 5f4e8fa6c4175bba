package qmp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"time"
)

// Agent is a client for the QEMU guest agent (qemu-ga) on the host end of
// its virtio-serial channel (a chardev unix socket). qemu-ga answers one
// command at a time, in order and without ids, so Agent serialises calls.
// The channel may hold stale bytes from an earlier client or a command that
// timed out; Agent resynchronises with guest-sync-delimited on connect and
// after any call that did not end with a clean reply.
type Agent struct {
	uc   *net.UnixConn
	opts options
	log  *slog.Logger

	mu       sync.Mutex // one command at a time
	in       *pushback
	dec      *json.Decoder
	needSync bool
	err      error // set once the channel is gone
}

// syncMarker is the byte qemu-ga puts before guest-sync-delimited's reply and
// that resets its parser when sent to it; it never occurs in UTF-8 JSON.
const syncMarker = 0xFF

// DialAgent connects to the guest agent's chardev socket and synchronises
// with guest-sync-delimited. It waits until the agent answers or ctx is done;
// if ctx has no deadline, the connect timeout (WithConnectTimeout) bounds it.
// Give a ctx with a longer deadline to wait for a guest that is still booting.
// Like the QMP monitor, the channel serves one client at a time.
func DialAgent(ctx context.Context, socketPath string, opts ...Option) (*Agent, error) {
	o := buildOptions(opts)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.connectTimeout)
		defer cancel()
	}
	nc, err := dialSocket(ctx, socketPath, o.noSymlink)
	if err != nil {
		return nil, fmt.Errorf("qmp: guest agent: dial %s: %w", socketPath, err)
	}
	a := &Agent{
		uc:   nc.(*net.UnixConn),
		opts: o,
		log:  o.logger.With("agent", socketPath),
		in:   &pushback{r: nc},
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	release := a.bound(ctx)
	err = a.sync()
	release()
	if err != nil {
		err = timeoutErr(ctx, err)
		a.uc.Close()
		return nil, fmt.Errorf("qmp: guest agent %s: %w", socketPath, err)
	}
	return a, nil
}

// Close closes the channel; a call in progress fails at once.
func (a *Agent) Close() error {
	err := a.uc.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		a.err = ErrClosed
	}
	return err
}

// Execute runs an agent command with args (nil for none) and unmarshals its
// "return" into result (nil to ignore), bounded by ctx and the command
// timeout (DefaultAgentCommandTimeout unless WithCommandTimeout).
func (a *Agent) Execute(ctx context.Context, command string, args, result any) error {
	return a.call(ctx, command, args, result, false)
}

// call runs one command. noReply is for commands that answer only on failure
// (guest-shutdown): the channel closing or staying silent means success.
func (a *Agent) call(ctx context.Context, command string, args, result any, noReply bool) error {
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
	}{command, args}
	payload, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp: guest agent: %s: %w", command, err)
	}
	payload = append(payload, '\n')

	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return fmt.Errorf("qmp: guest agent: %s: %w", command, a.err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.opts.timeoutFor(command, DefaultAgentCommandTimeout))
	defer cancel()
	release := a.bound(ctx)
	var r message
	sent := false
	if err = a.syncIfNeeded(); err == nil {
		r, sent, err = a.roundTrip(payload)
	}
	release()
	if err != nil {
		a.needSync = true // a reply may still arrive: resync before the next command
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			a.err = fmt.Errorf("%w: %w", ErrClosed, err)
			err = a.err
		}
		if noReply && sent && (errors.Is(err, ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded)) {
			return nil
		}
		return fmt.Errorf("qmp: guest agent: %s: %w", command, timeoutErr(ctx, err))
	}
	if r.Error != nil {
		r.Error.Command = command
		return r.Error
	}
	if result != nil && len(r.Return) > 0 {
		if err := json.Unmarshal(r.Return, result); err != nil {
			return fmt.Errorf("qmp: guest agent: %s: decode reply: %w", command, err)
		}
	}
	return nil
}

func (a *Agent) syncIfNeeded() error {
	if !a.needSync {
		return nil
	}
	return a.sync()
}

// roundTrip writes one command and reads one reply; sent reports whether
// the whole command went out.
func (a *Agent) roundTrip(payload []byte) (m message, sent bool, err error) {
	if _, err := a.uc.Write(payload); err != nil {
		return m, false, err
	}
	a.in.limit(MaxAgentReply)
	defer a.in.limit(0)
	err = a.dec.Decode(&m)
	return m, true, err
}

// bound makes the socket's I/O end at ctx's deadline or cancellation. The
// returned function undoes it.
func (a *Agent) bound(ctx context.Context) func() {
	dl, _ := ctx.Deadline()
	_ = a.uc.SetDeadline(dl)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = a.uc.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	return func() {
		if stop() {
			_ = a.uc.SetDeadline(time.Time{})
		} else {
			<-fired // must not land on the next call's deadline
		}
	}
}

// timeoutErr makes a socket timeout (the socket's deadline is ctx's) wrap
// ctx's error, so callers can test for context.DeadlineExceeded.
func timeoutErr(ctx context.Context, err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	cerr := ctx.Err()
	if cerr == nil {
		cerr = context.DeadlineExceeded
	}
	return fmt.Errorf("%w (%v)", cerr, err)
}

// sync sends 0xFF (flushing the agent's parser) and guest-sync-delimited
// with a random id, then skips input until a 0xFF followed by a reply that
// echoes that id. Replies to earlier syncs or commands are discarded.
// The caller bounds it with bound.
func (a *Agent) sync() error {
	id := rand.Int64N(1 << 53) // exact in JSON doubles
	req := fmt.Appendf([]byte{syncMarker}, `{"execute":"guest-sync-delimited","arguments":{"id":%d}}`+"\n", id)
	if _, err := a.uc.Write(req); err != nil {
		return fmt.Errorf("guest-sync-delimited: %w", err)
	}
	skipped := 0
	for {
		if a.dec != nil {
			a.in.unread(a.dec.Buffered())
		}
		n, err := a.in.skipPast(syncMarker)
		skipped += n
		if err != nil {
			return fmt.Errorf("guest-sync-delimited: no reply (skipped %d bytes): %w", skipped, err)
		}
		// A fresh decoder: the old one may hold a sticky syntax error.
		a.dec = json.NewDecoder(a.in)
		var r struct {
			Return *int64 `json:"return"`
		}
		if err := a.dec.Decode(&r); err != nil {
			var se *json.SyntaxError
			var te *json.UnmarshalTypeError
			if errors.As(err, &se) || errors.As(err, &te) {
				continue // garbage after a marker: look for the next one
			}
			return fmt.Errorf("guest-sync-delimited: %w", err)
		}
		if r.Return != nil && *r.Return == id {
			a.needSync = false
			if skipped > 0 {
				a.log.Debug("guest agent resynchronised", "skipped", skipped)
			}
			return nil
		}
		a.log.Debug("guest agent: stale reply discarded")
	}
}

// pushback reads from r after returning any bytes put back with unread.
type pushback struct {
	buf    []byte
	r      io.Reader
	budget bool  // left bounds reads from r
	left   int64 // bytes r may still give while budget
}

func (p *pushback) Read(b []byte) (int, error) {
	if len(p.buf) > 0 {
		n := copy(b, p.buf)
		p.buf = p.buf[n:]
		return n, nil
	}
	if p.budget {
		if p.left <= 0 {
			return 0, ErrReplyTooLarge
		}
		b = b[:min(int64(len(b)), p.left)]
	}
	n, err := p.r.Read(b)
	p.left -= int64(n)
	return n, err
}

// limit bounds what the next reply may read from the guest (0: no bound).
func (p *pushback) limit(n int64) { p.budget, p.left = n > 0, n }

// MaxAgentReply bounds one reply of the guest agent: the guest writes it,
// and root vmsup must not buffer whatever a hostile guest sends. 16 MiB
// holds a 12 MiB file chunk or exec output in base64.
const MaxAgentReply = 16 << 20

// ErrReplyTooLarge is a guest agent reply over MaxAgentReply.
var ErrReplyTooLarge = errors.New("qmp: guest agent: reply larger than 16 MiB")

// unread puts the rest of r back in front of the stream.
func (p *pushback) unread(r io.Reader) {
	rest, _ := io.ReadAll(r)
	if len(rest) > 0 {
		p.buf = append(rest, p.buf...)
	}
}

// skipPast discards input up to and including the first byte c and returns
// how many bytes it discarded before c.
func (p *pushback) skipPast(c byte) (int, error) {
	skipped := 0
	chunk := make([]byte, 4096)
	for {
		n, err := p.Read(chunk)
		if i := bytes.IndexByte(chunk[:n], c); i >= 0 {
			p.buf = append(bytes.Clone(chunk[i+1:n]), p.buf...)
			return skipped + i, nil
		}
		skipped += n
		if err != nil {
			return skipped, err
		}
	}
}

// Ping checks that the agent answers (guest-ping).
func (a *Agent) Ping(ctx context.Context) error {
	return a.Execute(ctx, "guest-ping", nil, nil)
}

// AgentInfo is guest-info's reply.
type AgentInfo struct {
	Version           string             `json:"version"`
	SupportedCommands []AgentCommandInfo `json:"supported_commands"`
}

// AgentCommandInfo describes one agent command.
type AgentCommandInfo struct {
	Name    string `json:"name"`
	Enabled bool   `json:"enabled"`
	// SuccessResponse is false for commands that send no reply on success.
	SuccessResponse bool `json:"success-response"`
}

// Info returns the agent's version and commands.
func (a *Agent) Info(ctx context.Context) (AgentInfo, error) {
	var i AgentInfo
	err := a.Execute(ctx, "guest-info", nil, &i)
	return i, err
}

// OSInfo is guest-get-osinfo's reply; fields the guest lacks are empty.
type OSInfo struct {
	KernelRelease string `json:"kernel-release,omitempty"`
	KernelVersion string `json:"kernel-version,omitempty"`
	Machine       string `json:"machine,omitempty"`
	ID            string `json:"id,omitempty"`
	Name          string `json:"name,omitempty"`
	PrettyName    string `json:"pretty-name,omitempty"`
	Version       string `json:"version,omitempty"`
	VersionID     string `json:"version-id,omitempty"`
	Variant       string `json:"variant,omitempty"`
	VariantID     string `json:"variant-id,omitempty"`
}

// OSInfo returns the guest's OS and kernel.
func (a *Agent) OSInfo(ctx context.Context) (OSInfo, error) {
	var o OSInfo
	err := a.Execute(ctx, "guest-get-osinfo", nil, &o)
	return o, err
}

// Shutdown asks the guest to shut down; mode is "powerdown" (default if
// empty), "halt" or "reboot". qemu-ga replies only on failure, so an error
// reply is returned as *Error, and the channel closing or staying silent
// until ctx or the command timeout ends counts as success (see guest-shutdown
// in qemu-ga-ref). Give ctx a short deadline to return sooner.
func (a *Agent) Shutdown(ctx context.Context, mode string) error {
	args := struct {
		Mode string `json:"mode,omitempty"`
	}{mode}
	return a.call(ctx, "guest-shutdown", args, nil, true)
}

// Exec starts path with args in the guest (guest-exec) and returns its pid.
// With captureOutput, stdout and stderr are kept for ExecStatus.
func (a *Agent) Exec(ctx context.Context, path string, args []string, captureOutput bool) (int64, error) {
	req := struct {
		Path    string   `json:"path"`
		Arg     []string `json:"arg,omitempty"`
		Capture bool     `json:"capture-output,omitempty"`
	}{path, args, captureOutput}
	var r struct {
		PID int64 `json:"pid"`
	}
	err := a.Execute(ctx, "guest-exec", req, &r)
	return r.PID, err
}

// ExecStatus is guest-exec-status's reply, with output base64-decoded.
type ExecStatus struct {
	Exited          bool   `json:"exited"`
	ExitCode        *int   `json:"exitcode,omitempty"`
	Signal          *int   `json:"signal,omitempty"`
	Stdout          []byte `json:"out-data,omitempty"`
	Stderr          []byte `json:"err-data,omitempty"`
	StdoutTruncated bool   `json:"out-truncated,omitempty"`
	StderrTruncated bool   `json:"err-truncated,omitempty"`
}

// ExecStatus polls a process started by Exec once. After it reports Exited,
// the agent forgets the pid.
func (a *Agent) ExecStatus(ctx context.Context, pid int64) (ExecStatus, error) {
	args := struct {
		PID int64 `json:"pid"`
	}{pid}
	var s ExecStatus
	err := a.Execute(ctx, "guest-exec-status", args, &s)
	return s, err
}

// ExecWait polls ExecStatus every interval (50 ms if <= 0) until the process
// exits or ctx is done.
func (a *Agent) ExecWait(ctx context.Context, pid int64, interval time.Duration) (ExecStatus, error) {
	if interval <= 0 {
		interval = 50 * time.Millisecond
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s, err := a.ExecStatus(ctx, pid)
		if err != nil || s.Exited {
			return s, err
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("qmp: guest agent: waiting for pid %d: %w", pid, ctx.Err())
		case <-t.C:
		}
	}
}

// GuestVCPU is one entry of guest-get-vcpus.
type GuestVCPU struct {
	LogicalID  int64 `json:"logical-id"`
	Online     bool  `json:"online"`
	CanOffline *bool `json:"can-offline,omitempty"`
}

// GetVCPUs lists the guest's view of its vCPUs.
func (a *Agent) GetVCPUs(ctx context.Context) ([]GuestVCPU, error) {
	var v []GuestVCPU
	err := a.Execute(ctx, "guest-get-vcpus", nil, &v)
	return v, err
}

// Describe is the agent's version and the guest's OS as one line ("Debian
// GNU/Linux 12 (kernel 6.1.0-57-amd64)"); what the agent does not say is
// left empty.
func (a *Agent) Describe(ctx context.Context) (version, os string) {
	if info, err := a.Info(ctx); err == nil {
		version = info.Version
	}
	if osi, err := a.OSInfo(ctx); err == nil {
		os = cmp.Or(osi.PrettyName, osi.Name)
		if osi.KernelRelease != "" {
			os += " (kernel " + osi.KernelRelease + ")"
		}
	}
	return version, os
}

// FileOpen opens path in the guest (guest-file-open); mode is fopen's
// ("r", "w", ...). The handle must be closed with FileClose.
func (a *Agent) FileOpen(ctx context.Context, path, mode string) (int64, error) {
	args := struct {
		Path string `json:"path"`
		Mode string `json:"mode,omitempty"`
	}{path, mode}
	var h int64
	err := a.Execute(ctx, "guest-file-open", args, &h)
	return h, err
}

// FileRead reads up to count bytes (guest-file-read) and says whether the
// end of the file was reached.
func (a *Agent) FileRead(ctx context.Context, handle int64, count int) ([]byte, bool, error) {
	args := struct {
		Handle int64 `json:"handle"`
		Count  int   `json:"count"`
	}{handle, count}
	var r struct {
		Count int    `json:"count"`
		Data  []byte `json:"buf-b64"` // encoding/json decodes base64 into []byte
		EOF   bool   `json:"eof"`
	}
	err := a.Execute(ctx, "guest-file-read", args, &r)
	return r.Data, r.EOF, err
}

// FileWrite writes data at the file's position (guest-file-write) and
// returns how many bytes were written.
func (a *Agent) FileWrite(ctx context.Context, handle int64, data []byte) (int, error) {
	args := struct {
		Handle int64  `json:"handle"`
		Data   []byte `json:"buf-b64"`
	}{handle, data}
	var r struct {
		Count int `json:"count"`
	}
	err := a.Execute(ctx, "guest-file-write", args, &r)
	return r.Count, err
}

// FileClose closes a handle from FileOpen (guest-file-close).
func (a *Agent) FileClose(ctx context.Context, handle int64) error {
	args := struct {
		Handle int64 `json:"handle"`
	}{handle}
	return a.Execute(ctx, "guest-file-close", args, nil)
}

// GuestInterface is one entry of guest-network-get-interfaces.
type GuestInterface struct {
	Name      string `json:"name"`
	MAC       string `json:"hardware-address,omitempty"`
	Addresses []struct {
		Type    string `json:"ip-address-type"` // "ipv4" or "ipv6"
		Address string `json:"ip-address"`
		Prefix  int    `json:"prefix"`
	} `json:"ip-addresses,omitempty"`
}

// NetworkInterfaces lists the guest's interfaces and their addresses.
func (a *Agent) NetworkInterfaces(ctx context.Context) ([]GuestInterface, error) {
	var v []GuestInterface
	err := a.Execute(ctx, "guest-network-get-interfaces", nil, &v)
	return v, err
}
