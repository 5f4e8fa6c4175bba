package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/observe/auditlog"
	"github.com/vmsup/vmsup/internal/ops/qmppolicy"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// The audit logs' sizes. Ordinary traffic goes to qmp.log only; refused
// and --unsafe commands to qmp-security.log as well, which nothing else
// writes, so padding in passed commands cannot push them out. Refusals,
// which anyone may send by the thousand, take at most half of either log
// (auditlog.Log.Refusal): a flood of them drops older refusals, never an
// --unsafe or passed entry. An entry is at most about maxAuditCommand+2
// KiB: the security log holds some 700 of them, and twice that with its
// old file.
const (
	qmpLogMax         = 1 << 20
	qmpSecurityLogMax = 4 << 20
)

// qmpEnv is what the policy needs to know of the VM's QEMU: its state
// directory, its real working directory, the taps vmsup made for it.
func (s *Supervisor) qmpEnv(name string) qmppolicy.Env {
	p := s.env.Paths(name)
	env := qmppolicy.Env{StateDir: p.Dir}
	if pid := vmstore.QEMUPID(name, p.QMP); pid > 0 {
		if cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd"); err == nil && filepath.IsAbs(cwd) && !strings.HasSuffix(cwd, " (deleted)") {
			env.WorkDir = cwd
		}
	}
	if rec, err := nics.ReadRecord(p); err == nil {
		for _, n := range rec.NICs {
			env.Taps = append(env.Taps, n.Tap)
		}
	}
	return env
}

// qmpAudit logs a raw QMP command: to ROOT/records/NAME/qmp.log, a refused
// or unsafe one to qmp-security.log first, and to the systemd journal where
// one listens. An error means the command must not be sent.
func (s *Supervisor) qmpAudit(ctx context.Context, name string, v qmppolicy.Verdict, refusal *qmppolicy.Refusal, command []byte) error {
	p := s.env.Paths(name)
	if err := p.MakeRecords(); err != nil {
		return err
	}
	e := qmppolicy.NewAuditEntry(v, refusal, command)
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if v != qmppolicy.Passed {
		l := auditlog.Log{Path: filepath.Join(p.Records, "qmp-security.log"), Max: qmpSecurityLogMax, Refusal: isRefusedEntry}
		if err := l.Append(ctx, line); err != nil {
			return err
		}
	}
	l := auditlog.Log{Path: filepath.Join(p.Records, "qmp.log"), Max: qmpLogMax, Refusal: isRefusedEntry}
	if err := l.Append(ctx, line); err != nil {
		return err
	}
	if journal.Enabled() {
		msg := fmt.Sprintf("vmsup qmp %s: %s %q", name, v, e.Execute)
		prio := journal.PriInfo
		if refusal != nil {
			msg += ": " + refusal.Reason
			prio = journal.PriWarning
		}
		_ = journal.Send(msg, prio, map[string]string{"VMSUP_VM": name, "VMSUP_QMP_VERDICT": string(v),
			"VMSUP_QMP_SHA256": e.SHA256, "VMSUP_QMP_SIZE": strconv.Itoa(e.Size), "VMSUP_QMP_COMMAND": string(e.Command)})
	}
	return nil
}

// isRefusedEntry tells a refused command's audit entry from the others.
func isRefusedEntry(line []byte) bool {
	var e struct {
		Verdict qmppolicy.Verdict `json:"verdict"`
	}
	return json.Unmarshal(line, &e) == nil && e.Verdict == qmppolicy.Refused
}
