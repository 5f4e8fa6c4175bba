package qmp

import (
	"log/slog"
	"strings"
	"time"
)

// Defaults for Dial and DialAgent.
const (
	DefaultConnectTimeout      = 2 * time.Second
	DefaultCommandTimeout      = 500 * time.Millisecond
	DefaultAgentCommandTimeout = 5 * time.Second
	DefaultEventBuffer         = 256
)

// slowCommands are commands that legitimately take longer than the default
// (figures from Incus and measurements in /work/shared/notes/qmp.md).
// A name ending in "*" is a prefix.
var slowCommands = [...]struct {
	name    string
	timeout time.Duration
}{
	{"blockdev-*", 5 * time.Second},
	{"block-*", 5 * time.Second},
	{"device_add", 5 * time.Second},
	{"device_del", 5 * time.Second},
	{"netdev_add", 5 * time.Second},
	{"netdev_del", 5 * time.Second},
	{"object-add", 5 * time.Second},
	{"object-del", 5 * time.Second},
	{"human-monitor-command", 5 * time.Second},
	{"screendump", 5 * time.Second},
	{"query-qmp-schema", 30 * time.Second},
	{"migrate*", 30 * time.Second},
	{"query-migrate*", 30 * time.Second},
	{"dump-guest-memory", 30 * time.Second},
	{"snapshot-*", 30 * time.Second},
}

// DefaultTimeout returns the built-in timeout for command: a longer one for
// commands known to be slow, otherwise fallback.
func DefaultTimeout(command string, fallback time.Duration) time.Duration {
	for _, s := range slowCommands {
		if p, ok := strings.CutSuffix(s.name, "*"); ok && strings.HasPrefix(command, p) || s.name == command {
			return s.timeout
		}
	}
	return fallback
}

type options struct {
	connectTimeout time.Duration
	commandTimeout time.Duration // 0: client's default
	timeouts       map[string]time.Duration
	logger         *slog.Logger
	eventBuffer    int
	capabilities   []string
}

func buildOptions(opts []Option) options {
	o := options{
		connectTimeout: DefaultConnectTimeout,
		eventBuffer:    DefaultEventBuffer,
		logger:         slog.New(slog.DiscardHandler),
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// timeoutFor returns the timeout for command; fallback is the client's
// default when WithCommandTimeout was not given.
func (o *options) timeoutFor(command string, fallback time.Duration) time.Duration {
	if d, ok := o.timeouts[command]; ok {
		return d
	}
	if o.commandTimeout > 0 {
		fallback = o.commandTimeout
	}
	return max(fallback, DefaultTimeout(command, fallback))
}

// Option configures Dial or DialAgent.
type Option func(*options)

// WithConnectTimeout bounds dialing, the greeting and capability negotiation
// (for the agent: the first guest-sync-delimited when ctx has no deadline).
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) { o.connectTimeout = d }
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
