package supervisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/vmsup/vmsup/internal/auditlog"
	"github.com/vmsup/vmsup/internal/qmppolicy"
	"github.com/vmsup/vmsup/internal/vmnet"
)

// qmpVerdict is what became of a raw QMP command.
type qmpVerdict string

const (
	qmpPassed  qmpVerdict = "passed"  // on the allow-list
	qmpRefused qmpVerdict = "refused" // off it, not sent
	qmpUnsafe  qmpVerdict = "unsafe"  // off it, sent because of --unsafe
)

// The audit logs' sizes. Ordinary traffic goes to qmp.log only; refused
// and --unsafe commands to qmp-security.log as well, which nothing else
// writes, so padding in passed commands cannot push them out. An entry is
// at most about maxAuditCommand+2 KiB: the security log holds some 700 of
// them, and twice that with its old file.
const (
	qmpLogMax         = 1 << 20
	qmpSecurityLogMax = 4 << 20
	maxAuditCommand   = 4 << 10 // the command as logged
	maxAuditString    = 256     // a string in it, before it is shortened
)

// qmpAuditEntry is one raw command in the audit logs, bounded whatever the
// command's size: long strings shortened, the whole kept as its size and
// SHA-256.
type qmpAuditEntry struct {
	Time    time.Time  `json:"time"`
	PID     int        `json:"pid"`
	UID     int        `json:"uid"`
	Verdict qmpVerdict `json:"verdict"`
	Execute string     `json:"execute,omitempty"`
	Class   string     `json:"class,omitempty"`  // of a refusal
	Reason  string     `json:"reason,omitempty"` // of a refusal
	Size    int        `json:"size"`
	SHA256  string     `json:"sha256"`
	// Command is the command with strings over maxAuditString bytes
	// shortened; if that is still over maxAuditCommand, a JSON string of
	// its head (Shortened says either happened).
	Command   json.RawMessage `json:"command"`
	Shortened bool            `json:"shortened,omitempty"`
}

// qmpEnv is what the policy needs to know of the VM's QEMU: its state
// directory, its real working directory, the taps vmsup made for it.
func (s *Supervisor) qmpEnv(name string) qmppolicy.Env {
	p := s.paths(name)
	env := qmppolicy.Env{StateDir: p.Dir}
	if pid := qemuPID(name, p.QMP); pid > 0 {
		if cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd"); err == nil && filepath.IsAbs(cwd) && !strings.HasSuffix(cwd, " (deleted)") {
			env.WorkDir = cwd
		}
	}
	if rec, err := vmnet.ReadRecord(p); err == nil {
		for _, n := range rec.NICs {
			env.Taps = append(env.Taps, n.Tap)
		}
	}
	return env
}

// qmpAudit logs a raw QMP command: to ROOT/records/NAME/qmp.log, a refused
// or unsafe one to qmp-security.log first, and to the systemd journal where
// one listens. An error means the command must not be sent.
func (s *Supervisor) qmpAudit(ctx context.Context, name string, v qmpVerdict, refusal *qmppolicy.Refusal, command []byte) error {
	p := s.paths(name)
	if err := p.MakeRecords(); err != nil {
		return err
	}
	e := newAuditEntry(v, refusal, command)
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if v != qmpPassed {
		l := auditlog.Log{Path: filepath.Join(p.Records, "qmp-security.log"), Max: qmpSecurityLogMax}
		if err := l.Append(ctx, line); err != nil {
			return err
		}
	}
	l := auditlog.Log{Path: filepath.Join(p.Records, "qmp.log"), Max: qmpLogMax}
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

func newAuditEntry(v qmpVerdict, refusal *qmppolicy.Refusal, command []byte) qmpAuditEntry {
	sum := sha256.Sum256(command)
	e := qmpAuditEntry{Time: time.Now().UTC(), PID: os.Getpid(), UID: os.Getuid(), Verdict: v,
		Size: len(command), SHA256: hex.EncodeToString(sum[:])}
	if cmd, err := qmppolicy.Parse(command); err == nil {
		e.Execute = cutString(cmd.Execute, 128)
	}
	if refusal != nil {
		e.Class, e.Reason = refusal.Class.String(), cutString(refusal.Reason, 1024)
	}
	e.Command, e.Shortened = auditCommand(command)
	return e
}

// auditCommand is command as an entry holds it (see qmpAuditEntry).
func auditCommand(command []byte) (json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(command))
	dec.UseNumber()
	var v any
	shortened := false
	out := []byte(nil)
	if dec.Decode(&v) == nil && !dec.More() {
		v, shortened = shorten(v, 0)
		out, _ = json.Marshal(v)
	} else {
		out, _ = json.Marshal(cutString(string(command), maxAuditCommand))
		shortened = len(command) > maxAuditCommand
	}
	if len(out) > maxAuditCommand {
		out, _ = json.Marshal(cutString(string(out), maxAuditCommand))
		shortened = true
	}
	return out, shortened
}

// shorten returns v with strings (keys too) cut to maxAuditString bytes,
// lists to 32 elements and nesting to 16 levels, and whether it cut.
func shorten(v any, depth int) (any, bool) {
	if depth > 16 {
		return "...(nested deeper)", true
	}
	switch x := v.(type) {
	case string:
		if len(x) <= maxAuditString {
			return x, false
		}
		return cutString(x, maxAuditString-32) + fmt.Sprintf("...(%d bytes)", len(x)), true
	case []any:
		cut := len(x) > 32
		out := make([]any, 0, min(len(x), 33))
		for _, e := range x[:min(len(x), 32)] {
			s, c := shorten(e, depth+1)
			out, cut = append(out, s), cut || c
		}
		if len(x) > 32 {
			out = append(out, fmt.Sprintf("...(%d more)", len(x)-32))
		}
		return out, cut
	case map[string]any:
		cut := false
		out := make(map[string]any, len(x))
		keys := slices.Sorted(maps.Keys(x))
		for i, k := range keys {
			s, c := shorten(x[k], depth+1)
			sk, ck := shorten(k, depth+1)
			key := sk.(string)
			if ck {
				key = fmt.Sprintf("%s#%d", key, i) // two long keys may cut alike
			}
			out[key], cut = s, cut || c || ck
		}
		return out, cut
	}
	return v, false
}

// cutString is s cut to at most n bytes on a rune boundary.
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
