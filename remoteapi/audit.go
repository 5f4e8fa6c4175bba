package remoteapi

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/vmsup/vmsup/internal/observe/auditlog"
)

// The audit of API calls, in the style of raw QMP's (supervisor qmpAudit):
// one bounded JSON line per call in ROOT/remote/api.log, a refused call in
// api-security.log too (which allowed calls cannot push out), and a journal
// message where a journal listens. An allowed call is audited before it
// acts; if the entry cannot be written, the call is refused.

// Sizes of the audit logs (rotated once, as qmp.log).
const (
	apiLogMax         = 4 << 20
	apiSecurityLogMax = 4 << 20
)

// Verdict is what became of a call.
type Verdict string

// Verdicts.
const (
	Allowed Verdict = "allowed"
	Refused Verdict = "refused"
)

// AuditEntry is one call in the audit logs.
type AuditEntry struct {
	Time      time.Time `json:"time"`
	PID       int       `json:"pid"`
	Identity  string    `json:"identity"`  // "cn:NAME", "uid:N", "" if none was found
	Transport string    `json:"transport"` // tls or unix
	Remote    string    `json:"remote"`    // the peer's address
	Call      string    `json:"call"`      // the route: "POST /v1/vms/{name}/down"
	VMs       []string  `json:"vms"`       // the VMs it concerns ([] for a listing)
	Verdict   Verdict   `json:"verdict"`
	Reason    string    `json:"reason,omitempty"` // of a refusal
}

// auditDir is where the logs are: ROOT/remote.
func (s *Server) auditDir() string { return filepath.Join(s.Root, "remote") }

// audit writes e; an error means the call must not go on.
func (s *Server) audit(ctx context.Context, e AuditEntry) error {
	e.Time, e.PID = time.Now().UTC(), os.Getpid()
	if e.VMs == nil {
		e.VMs = []string{}
	}
	e.Reason = cut(e.Reason, 1024)
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.auditDir(), 0o700); err != nil {
		return err
	}
	if e.Verdict != Allowed {
		l := auditlog.Log{Path: filepath.Join(s.auditDir(), "api-security.log"), Max: apiSecurityLogMax}
		if err := l.Append(ctx, line); err != nil {
			return err
		}
	}
	l := auditlog.Log{Path: filepath.Join(s.auditDir(), "api.log"), Max: apiLogMax}
	if err := l.Append(ctx, line); err != nil {
		return err
	}
	if journal.Enabled() {
		msg := fmt.Sprintf("vmsup api %s: %s %s %s", e.Identity, e.Verdict, e.Call, strings.Join(e.VMs, ","))
		prio := journal.PriInfo
		if e.Verdict != Allowed {
			msg += ": " + e.Reason
			prio = journal.PriWarning
		}
		_ = journal.Send(msg, prio, map[string]string{"VMSUP_API_IDENTITY": e.Identity, "VMSUP_API_VERDICT": string(e.Verdict),
			"VMSUP_API_CALL": e.Call, "VMSUP_API_REMOTE": e.Remote, "VMSUP_API_VMS": strings.Join(e.VMs, ",")})
	}
	return nil
}

// cut is s cut to n bytes.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
