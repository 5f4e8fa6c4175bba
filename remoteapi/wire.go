package remoteapi

import (
	"errors"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// The wire: request bodies and what every answer carries. A result is the
// supervisor's own type, encoded with encoding/json (its fields' tags, or
// their Go names); openapi.json describes each (TestOpenAPIGolden keeps it
// in step with these types).

// Version is the API's major version, the first element of every path.
const Version = "v1"

// File is a VM file submitted by content: the server parses and checks it
// as it would a file on its own disk (Server.files).
type File struct {
	// Name is the file's name as the client has it ("web.toml"), for
	// messages; only its base name is used.
	Name    string `json:"name"`
	Content string `json:"content"`
}

// UpRequest is POST /v1/up.
type UpRequest struct {
	Files []File `json:"files"`
	Adopt bool   `json:"adopt"`
}

// PlanRequest is POST /v1/plan.
type PlanRequest struct {
	File  File `json:"file"`
	Adopt bool `json:"adopt"`
}

// ApplyRequest is POST /v1/apply.
type ApplyRequest struct {
	File         File `json:"file"`
	Restart      bool `json:"restart"`
	AtNextReboot bool `json:"at_next_reboot"`
	Adopt        bool `json:"adopt"`
}

// RestartRequest is POST /v1/vms/{name}/restart: with a file, restart
// with it; without, with the spec the VM last ran.
type RestartRequest struct {
	File *File `json:"file"`
}

// DownRequest is POST /v1/vms/{name}/down.
type DownRequest struct {
	Timeout time.Duration `json:"timeout"` // nanoseconds; 0: the VM's stop_timeout
	Force   bool          `json:"force"`
}

// RebootRequest is POST /v1/vms/{name}/reboot.
type RebootRequest struct {
	Mode supervisor.RebootMode `json:"mode"`
}

// SnapshotRequest is POST /v1/vms/{name}/snapshots.
type SnapshotRequest struct {
	Tag    string `json:"tag"`
	Memory bool   `json:"memory"`
}

// RevertRequest is POST /v1/vms/{name}/snapshots/{tag}/revert.
type RevertRequest struct {
	Force bool `json:"force"`
}

// ExecRequest is POST /v1/vms/{name}/exec.
type ExecRequest struct {
	Argv    []string      `json:"argv"`
	Timeout time.Duration `json:"timeout"` // nanoseconds; 0: the guest agent's default
}

// TicketRequest is POST /v1/vms/{name}/vnc-ticket.
type TicketRequest struct {
	TTL time.Duration `json:"ttl"` // nanoseconds: how long the password lets a client log in
}

// Ticket is a VM's one-time VNC password; "" when its VNC server asks for
// none.
type Ticket struct {
	Password string `json:"password"`
}

// AppliedSpec is GET /v1/vms/{name}/spec: the spec the VM last ran.
type AppliedSpec struct {
	Path    string `json:"path"` // on the server
	Content string `json:"content"`
}

// StatsResult is GET /v1/stats.
type StatsResult struct {
	VMs     []supervisor.VMStats      `json:"vms"`
	Skipped []supervisor.StatsSkipped `json:"skipped"`
}

// Answer is every non-streamed answer: the operation's result (null when it
// has none, or failed before one) and its error (null when it succeeded).
// Operations that return both (up) give both.
type Answer[T any] struct {
	Result T      `json:"result"`
	Error  *Error `json:"error"`
}

// Line is one line of a streamed answer (events, logs: NDJSON): an item,
// or, last, the end with its error (null when the stream ended well).
type Line[T any] struct {
	Item *T     `json:"item,omitempty"`
	End  bool   `json:"end,omitempty"`
	Err  *Error `json:"error,omitempty"`
}

// Error is an error on the wire: the CLI's --json error (docs/cli-json.md)
// with kinds of the API's own.
type Error struct {
	Message string `json:"message"`
	// Kind: usage, not-found, busy, not-running, interrupted, failed (as
	// the CLI), and unauthorized (no identity the server knows),
	// forbidden (the identity's role does not allow it), too-large
	// (request size), too-many (calls of this client at once).
	Kind     string `json:"kind"`
	ExitCode int    `json:"exit_code"`
}

// Error kinds and the CLI's exit codes they map to.
const (
	KindUsage        = "usage"
	KindNotFound     = "not-found"
	KindBusy         = "busy"
	KindNotRunning   = "not-running"
	KindInterrupted  = "interrupted"
	KindFailed       = "failed"
	KindUnauthorized = "unauthorized"
	KindForbidden    = "forbidden"
	KindTooLarge     = "too-large"
	KindTooMany      = "too-many"
)

var exitCodes = map[string]int{KindUsage: 2, KindNotFound: 3, KindBusy: 4, KindNotRunning: 5, KindInterrupted: 130}

// ErrorOf is err on the wire (nil for nil), its kind from the supervisor's
// sentinels.
func ErrorOf(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var be *supervisor.BusyError
	kind := KindFailed
	switch {
	case errors.Is(err, supervisor.ErrNotFound):
		kind = KindNotFound
	case errors.As(err, &be):
		kind = KindBusy
	case errors.Is(err, supervisor.ErrNotRunning):
		kind = KindNotRunning
	case errors.Is(err, supervisor.ErrInterrupted):
		kind = KindInterrupted
	}
	return newError(kind, err.Error())
}

func newError(kind, msg string) *Error {
	code, ok := exitCodes[kind]
	if !ok {
		code = 1
	}
	return &Error{Message: msg, Kind: kind, ExitCode: code}
}

func (e *Error) Error() string { return e.Message }

// Is makes a received error match the supervisor's sentinel of its kind,
// so a caller branches on it as on a local one.
func (e *Error) Is(target error) bool {
	switch target {
	case supervisor.ErrNotFound:
		return e.Kind == KindNotFound
	case supervisor.ErrNotRunning:
		return e.Kind == KindNotRunning
	case supervisor.ErrInterrupted:
		return e.Kind == KindInterrupted
	}
	return false
}

// As gives a busy error as a *supervisor.BusyError (without the holder,
// which the message names).
func (e *Error) As(target any) bool {
	if t, ok := target.(**supervisor.BusyError); ok && e.Kind == KindBusy {
		*t = &supervisor.BusyError{}
		return true
	}
	return false
}
