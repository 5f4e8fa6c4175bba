package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// Conn is a QMP connection. It is safe for concurrent use: commands from
// many goroutines are in flight at once and matched to replies by id.
//
// Conn implements go-qemu's qmp.Monitor with its own transport rather than
// go-qemu's SocketMonitor; see the package documentation for why.
type Conn struct {
	uc       *net.UnixConn
	opts     options
	log      *slog.Logger
	greeting Greeting
	enabled  []string

	wmu  sync.Mutex // serialises writes so commands never interleave on the wire
	fdmu sync.Mutex // one fd-carrying command at a time: QEMU keeps one received fd per chardev

	nextID atomic.Uint64

	mu      sync.Mutex
	pending map[uint64]chan reply // nil once the connection has ended
	err     error                 // why the connection ended; nil while open
	closing bool                  // Close was called

	smu     sync.Mutex
	subs    map[*subscriber]struct{} // nil once the connection has ended
	dropped atomic.Uint64

	done chan struct{} // closed when the reader has stopped and failed everything
}

var _ qmp.Monitor = (*Conn)(nil)

// Greeting is what QEMU announces when a client connects.
type Greeting struct {
	Version      qmp.Version `json:"version"`
	Capabilities []string    `json:"capabilities"`
}

type reply struct {
	ret json.RawMessage
	err *Error
	bad error // the reply did not decode
}

// message is any object QEMU sends after the greeting: a reply or an event.
// It is decoded in one pass; events flood, so the reader must be cheap.
type message struct {
	ID     json.RawMessage `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	qmp.Event
}

// request is a command on the wire. Arguments is omitted when empty.
type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	ID        uint64          `json:"id"`
}

// Dial connects to the QMP socket at socketPath, reads QEMU's greeting and
// negotiates capabilities. All of it is bounded by ctx and the connect
// timeout (DefaultConnectTimeout unless WithConnectTimeout), so a stopped QEMU
// or a socket nobody serves yields an error rather than a hang. QEMU serves
// one client per monitor socket: while another client is connected, Dial
// gets no greeting and times out. QEMU creates the socket file just before
// it listens, so a Dial right after starting QEMU may be refused: retry.
func Dial(ctx context.Context, socketPath string, opts ...Option) (*Conn, error) {
	o := buildOptions(opts)
	ctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()

	nc, err := dialSocket(ctx, socketPath, o.noSymlink)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w", socketPath, err)
	}
	return openConn(ctx, nc.(*net.UnixConn), socketPath, o)
}

// NewConn runs QMP over uc, a unix socket already connected to a QEMU
// monitor (for example one end of a socketpair whose other end is QEMU's
// "-qmp stdio"): it reads the greeting and negotiates capabilities, bounded
// by ctx and the connect timeout. name labels errors and logs. The Conn
// owns uc from then on, also when NewConn fails.
func NewConn(ctx context.Context, uc *net.UnixConn, name string, opts ...Option) (*Conn, error) {
	o := buildOptions(opts)
	ctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	return openConn(ctx, uc, name, o)
}

func openConn(ctx context.Context, uc *net.UnixConn, socketPath string, o options) (*Conn, error) {

	// Read the greeting under the deadline; cancellation forces the read out.
	dl, _ := ctx.Deadline()
	_ = uc.SetReadDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = uc.SetReadDeadline(time.Unix(1, 0)) })
	dec := json.NewDecoder(uc)
	var g struct {
		QMP *Greeting `json:"QMP"`
	}
	err := dec.Decode(&g)
	if !stop() || errors.Is(err, os.ErrDeadlineExceeded) {
		// The socket deadline may fire a moment before ctx's timer.
		cerr := ctx.Err()
		if cerr == nil {
			cerr = context.DeadlineExceeded
		}
		uc.Close()
		return nil, fmt.Errorf("qmp: %s: waiting for greeting: %w", socketPath, cerr)
	}
	if err == nil && g.QMP == nil {
		err = errors.New("first message is not a QMP greeting")
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("qmp: %s: greeting: %w", socketPath, err)
	}
	_ = uc.SetReadDeadline(time.Time{})

	c := &Conn{
		uc:       uc,
		opts:     o,
		log:      o.logger.With("qmp", socketPath),
		greeting: *g.QMP,
		pending:  make(map[uint64]chan reply),
		subs:     make(map[*subscriber]struct{}),
		done:     make(chan struct{}),
	}
	go c.readLoop(dec)

	var args struct {
		Enable []string `json:"enable,omitempty"`
	}
	for _, want := range o.capabilities {
		switch {
		case slices.Contains(args.Enable, want):
		case slices.Contains(c.greeting.Capabilities, want):
			args.Enable = append(args.Enable, want)
		default:
			c.log.Debug("qmp capability not offered", "capability", want)
		}
	}
	if err := c.Execute(ctx, "qmp_capabilities", args, nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("qmp: %s: %w", socketPath, err)
	}
	c.enabled = args.Enable
	return c, nil
}

// Greeting returns QEMU's greeting: its version and offered capabilities.
func (c *Conn) Greeting() Greeting { return c.greeting }

// Capabilities returns the QMP capabilities enabled on this connection.
func (c *Conn) Capabilities() []string { return slices.Clone(c.enabled) }

// Execute runs command with args (marshalled as the "arguments" object; nil
// for none) and unmarshals the reply's "return" into result (nil to ignore).
// It waits at most until ctx is done or the command's timeout passes. A QMP
// error reply is returned as *Error; a timeout wraps
// context.DeadlineExceeded; a lost connection wraps ErrClosed.
func (c *Conn) Execute(ctx context.Context, command string, args, result any) error {
	return c.execute(ctx, command, args, result, nil)
}

func (c *Conn) execute(ctx context.Context, command string, args, result any, file *os.File) error {
	req := request{Execute: command, ID: c.nextID.Add(1)}
	if args != nil {
		b, err := json.Marshal(args)
		if err != nil {
			return fmt.Errorf("qmp: %s: marshal arguments: %w", command, err)
		}
		if string(b) != "null" {
			req.Arguments = b
		}
	}
	payload, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp: %s: %w", command, err)
	}
	r, err := c.roundTrip(ctx, command, req.ID, payload, file)
	if err != nil {
		return err
	}
	if r.bad != nil {
		return fmt.Errorf("qmp: %s: decode reply: %w", command, r.bad)
	}
	if r.err != nil {
		return r.err
	}
	if result != nil && len(r.ret) > 0 {
		if err := json.Unmarshal(r.ret, result); err != nil {
			return fmt.Errorf("qmp: %s: decode reply: %w", command, err)
		}
	}
	return nil
}

// ExecuteRaw sends a raw JSON command object (as typed by a user) and
// returns QEMU's raw reply object. Its "id" is replaced on the wire so the
// reply can be matched, and restored (or removed) in the returned reply. An
// error reply is returned as JSON and also as *Error.
func (c *Conn) ExecuteRaw(ctx context.Context, cmd []byte) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(cmd, &obj); err != nil {
		return nil, fmt.Errorf("qmp: raw command must be a JSON object: %w", err)
	}
	var name string
	for _, k := range []string{"execute", "exec-oob"} {
		if v, ok := obj[k]; ok {
			if err := json.Unmarshal(v, &name); err != nil {
				return nil, fmt.Errorf("qmp: raw command: %q must be a string: %w", k, err)
			}
		}
	}
	if name == "" {
		return nil, errors.New(`qmp: raw command: no "execute" member`)
	}
	origID, hadID := obj["id"]
	id := c.nextID.Add(1)
	obj["id"] = json.RawMessage(fmt.Appendf(nil, "%d", id))
	payload, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", name, err)
	}
	r, err := c.roundTrip(ctx, name, id, payload, nil)
	if err != nil {
		return nil, err
	}
	if r.bad != nil {
		return nil, fmt.Errorf("qmp: %s: decode reply: %w", name, r.bad)
	}
	// Rebuild the reply (QMP replies have only return or error, and id).
	out := struct {
		Return json.RawMessage `json:"return,omitempty"`
		Error  *Error          `json:"error,omitempty"`
		ID     json.RawMessage `json:"id,omitempty"`
	}{Return: r.ret, Error: r.err}
	if hadID {
		out.ID = origID
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", name, err)
	}
	if r.err != nil {
		return b, r.err
	}
	return b, nil
}

// roundTrip writes payload (with file as SCM_RIGHTS if non-nil) and waits for
// the reply with id.
func (c *Conn) roundTrip(ctx context.Context, command string, id uint64, payload []byte, file *os.File) (reply, error) {
	timeout := c.opts.timeoutFor(command, DefaultCommandTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()

	ch := make(chan reply, 1) // buffered: the reader never blocks on a reply
	c.mu.Lock()
	if c.pending == nil {
		err := c.err
		c.mu.Unlock()
		return reply{}, fmt.Errorf("qmp: %s: %w", command, err)
	}
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		c.mu.Unlock()
	}()

	if n, err := c.write(ctx, payload, file); err != nil {
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			// Nothing went out (QEMU is not reading): the stream is intact.
			return reply{}, fmt.Errorf("qmp: %s: send: %w", command, context.DeadlineExceeded)
		}
		// Peer gone, or half a command on the wire: the stream is lost.
		c.abort(fmt.Errorf("send %s: %w", command, err))
		return reply{}, fmt.Errorf("qmp: %s: %w", command, c.Err())
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return reply{}, fmt.Errorf("qmp: %s: %w", command, c.Err())
		}
		if r.err != nil {
			r.err.Command = command
		}
		c.log.Debug("qmp command", "command", command, "id", id, "took", time.Since(start), "error", r.err)
		return r, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return reply{}, fmt.Errorf("qmp: %s: no reply within %v: %w", command, time.Since(start).Round(time.Millisecond), ctx.Err())
		}
		return reply{}, fmt.Errorf("qmp: %s: %w", command, ctx.Err())
	}
}

// write sends one command under ctx's deadline (always set by roundTrip) and
// returns how many bytes went out.
func (c *Conn) write(ctx context.Context, payload []byte, file *os.File) (int, error) {
	payload = append(payload, '\n')
	c.wmu.Lock()
	defer c.wmu.Unlock()
	dl, _ := ctx.Deadline()
	_ = c.uc.SetWriteDeadline(dl)
	var n int
	var err error
	if file != nil {
		n, err = c.writeWithFD(payload, file)
	}
	if err == nil && n < len(payload) {
		var m int
		m, err = c.uc.Write(payload[n:])
		n += m
	}
	return n, err
}

// abort ends the connection because of cause and waits until the reader has
// failed everything pending.
func (c *Conn) abort(cause error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	c.mu.Unlock()
	c.uc.Close()
	<-c.done
}

// readLoop reads every message, delivers replies to their waiters and events
// to subscribers, and never blocks on either.
func (c *Conn) readLoop(dec *json.Decoder) {
	for {
		var m message
		err := dec.Decode(&m)
		var typeErr *json.UnmarshalTypeError
		if err != nil && !errors.As(err, &typeErr) {
			c.fail(err) // I/O error or syntax error: the stream is lost
			return
		}
		// A type error (e.g. a non-object "error") leaves the stream in
		// sync: the message is delivered with the error attached.
		if m.Event.Event != "" {
			if err != nil {
				c.log.Warn("qmp: undecodable event dropped", "event", m.Event.Event, "error", err)
				continue
			}
			c.deliver(m.Event)
			continue
		}
		var id uint64
		if jerr := json.Unmarshal(m.ID, &id); jerr != nil {
			c.log.Warn("qmp: reply without a known id dropped", "id", truncate(m.ID, 100), "qmp_error", m.Error, "decode_error", err)
			continue
		}
		c.mu.Lock()
		ch, ok := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if !ok {
			c.log.Debug("qmp: late reply dropped", "id", id)
			continue
		}
		ch <- reply{ret: m.Return, err: m.Error, bad: err}
	}
}

// fail ends the connection: every pending command and subscriber sees it at
// once, and Done is closed.
func (c *Conn) fail(cause error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, ch := range pending {
		close(ch)
	}
	c.smu.Lock()
	for s := range c.subs {
		close(s.ch)
	}
	c.subs = nil
	c.smu.Unlock()
	c.uc.Close()
	c.log.Debug("qmp connection ended", "cause", cause)
	close(c.done)
}

// Close closes the connection. Pending commands fail with ErrClosed and
// subscriber channels are closed. It waits for the reader to stop.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.err == nil {
		c.err = ErrClosed
	}
	c.closing = true
	c.mu.Unlock()
	c.uc.Close()
	<-c.done
	return nil
}

func (c *Conn) closedByUs() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// Done is closed when the connection has ended, whether by Close or because
// QEMU's side went away (QEMU exited or closed the monitor).
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended (wrapping ErrClosed), or nil while it
// is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending != nil {
		return nil
	}
	return c.err
}

// Connect implements qmp.Monitor. Dial has already connected; Connect only
// reports whether the connection is still open.
func (c *Conn) Connect() error { return c.Err() }

// Disconnect implements qmp.Monitor; it is Close.
func (c *Conn) Disconnect() error { return c.Close() }

// Run implements qmp.Monitor: ExecuteRaw under the command's default timeout.
func (c *Conn) Run(command []byte) ([]byte, error) {
	return c.ExecuteRaw(context.Background(), command)
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}
