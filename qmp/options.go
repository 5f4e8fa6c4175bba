package qmp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults for Dial and DialAgent.
const (
	DefaultConnectTimeout      = 2 * time.Second
	DefaultCommandTimeout      = 500 * time.Millisecond
	DefaultAgentCommandTimeout = 5 * time.Second
	DefaultEventBuffer         = 256
)

// DefaultTimeout returns the built-in timeout for command: longer for
// commands known to be slow (figures from Incus and from measurements in
// vmsup's QMP notes), otherwise fallback. It is a switch rather than a
// package-level map so that nothing at package level is mutable.
func DefaultTimeout(command string, fallback time.Duration) time.Duration {
	has := func(prefix string) bool { return strings.HasPrefix(command, prefix) }
	switch {
	case command == "query-qmp-schema", command == "dump-guest-memory",
		has("migrate"), has("query-migrate"), has("snapshot-"):
		return 30 * time.Second
	case command == "guest-fsfreeze-freeze", command == "guest-fsfreeze-freeze-list":
		// The guest agent's freeze flushes every filesystem first: on a
		// busy guest that takes long, and giving up early leaves the
		// caller not knowing whether the guest froze. Callers bound it
		// with their ctx.
		return 5 * time.Minute
	case command == "guest-fsfreeze-thaw":
		return time.Minute
	case command == "guest-file-write", command == "guest-file-read":
		// A chunk is megabytes through virtio-serial and the agent's
		// base64: under TCG on a busy host one took over 5 s. The copy as a
		// whole is bounded by its caller's ctx.
		return time.Minute
	case has("blockdev-"), has("block-"), has("block_"), has("device_"), has("netdev_"),
		has("object-"), command == "human-monitor-command", command == "screendump",
		// Block jobs and exports: they return once the job or export
		// exists (not when it ends), but may first drain I/O.
		command == "transaction", has("job-"), command == "query-jobs",
		has("nbd-server-"), command == "query-block-exports":
		return 5 * time.Second
	case has("system_"), command == "stop", command == "cont", command == "set_link", command == "balloon",
		command == "set-action":
		// They change the guest: a timeout would leave the caller not
		// knowing whether they did; on a loaded host the main loop can
		// take longer than the default to answer (seen under TCG).
		return 5 * time.Second
	}
	return fallback
}

type options struct {
	connectTimeout time.Duration
	connectSet     bool          // WithConnectTimeout: taken as given, not stretched
	commandTimeout time.Duration // 0: client's default
	timeouts       map[string]time.Duration
	logger         *slog.Logger
	eventBuffer    int
	capabilities   []string
	noSymlink      bool
	load           func() float64 // the host's load factor (LoadFactor)
}

func buildOptions(opts []Option) options {
	o := options{
		connectTimeout: DefaultConnectTimeout,
		eventBuffer:    DefaultEventBuffer,
		logger:         slog.New(slog.DiscardHandler),
		load:           LoadFactor,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if !o.connectSet && o.load != nil {
		// The greeting comes from QEMU's main loop: at load 16 on 2 cores
		// a TCG guest's QEMU just back from a memory revert took longer
		// than the default to send it.
		o.connectTimeout = time.Duration(float64(o.connectTimeout) * o.load())
	}
	return o
}

// timeoutFor returns the timeout for command; fallback is the client's
// default when WithCommandTimeout was not given.
func (o *options) timeoutFor(command string, fallback time.Duration) time.Duration {
	if d, ok := o.timeouts[command]; ok {
		return d
	}
	if command == "qmp_capabilities" {
		// Part of connecting: a QEMU that has just started may be slow.
		return o.connectTimeout
	}
	if o.commandTimeout > 0 {
		return max(o.commandTimeout, DefaultTimeout(command, o.commandTimeout))
	}
	// The built-in bound is for an idle host: a loaded one (a 2-core host
	// running a dozen QEMUs) answered add-fd after more than 500 ms.
	if o.load != nil {
		fallback = time.Duration(float64(fallback) * o.load())
	}
	return max(fallback, DefaultTimeout(command, fallback))
}

// Option configures Dial or DialAgent.
type Option func(*options)

// WithoutSymlink makes Dial and DialAgent refuse a socket path whose last
// component is not a socket (a symlink, say) and connect to the very inode
// they checked (through /proc/self/fd). A privileged client dialling a
// socket in a directory a less trusted process can write (QEMU's own) is
// then never redirected to another socket.
func WithoutSymlink() Option {
	return func(o *options) { o.noSymlink = true }
}

// WithConnectTimeout bounds dialing, the greeting and capability negotiation
// (for the agent: the first guest-sync-delimited when ctx has no deadline).
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) { o.connectTimeout, o.connectSet = d, true }
}

// WithCommandTimeout sets the default per-command timeout (500 ms for QMP,
// 5 s for the agent). Commands known to be slow keep their longer timeout
// unless d is longer still.
func WithCommandTimeout(d time.Duration) Option {
	return func(o *options) { o.commandTimeout = d }
}

// WithCommandTimeouts overrides the timeout of individual commands by name.
func WithCommandTimeouts(m map[string]time.Duration) Option {
	return func(o *options) {
		if o.timeouts == nil {
			o.timeouts = make(map[string]time.Duration, len(m))
		}
		for k, v := range m {
			o.timeouts[k] = v
		}
	}
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithEventBuffer sets the buffer size of each subscriber's channel
// (default 256). When it is full the oldest event is dropped.
func WithEventBuffer(n int) Option {
	return func(o *options) { o.eventBuffer = max(n, 1) }
}

// WithCapabilities asks for QMP capabilities (e.g. "oob") at negotiation.
// Only those QEMU offers in its greeting are enabled; see Conn.Capabilities.
func WithCapabilities(caps ...string) Option {
	return func(o *options) { o.capabilities = append(o.capabilities, caps...) }
}

// DialSocket connects to the unix socket found at path itself, never
// through a symlink there (see WithoutSymlink): for the VM's other sockets
// (serial console, migration stream) that a privileged process dials.
func DialSocket(ctx context.Context, path string) (net.Conn, error) {
	return dialSocket(ctx, path, true)
}

// dialSocket connects to the unix socket at path; with noSymlink only to a
// socket inode found at path itself (see WithoutSymlink).
func dialSocket(ctx context.Context, path string, noSymlink bool) (net.Conn, error) {
	var d net.Dialer
	if !noSymlink {
		return d.DialContext(ctx, "unix", path)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket (a symlink or other file put in its place is not followed)", path)
	}
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
}
