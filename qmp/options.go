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
	case has("blockdev-"), has("block-"), has("device_"), has("netdev_"),
		has("object-"), command == "human-monitor-command", command == "screendump":
		return 5 * time.Second
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
	if command == "qmp_capabilities" {
		// Part of connecting: a QEMU that has just started may be slow.
		return o.connectTimeout
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
