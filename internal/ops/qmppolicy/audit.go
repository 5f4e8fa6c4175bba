package qmppolicy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"
	"unicode/utf8"
)

// The audit entry of a raw QMP command: bounded whatever the command's
// size, so that no command can push others out of the audit logs.

// Bounds of an entry.
const (
	maxAuditCommand = 4 << 10 // the command as logged
	maxAuditString  = 256     // a string in it, before it is shortened
)

// Verdict is what became of a raw QMP command.
type Verdict string

// Verdicts.
const (
	Passed  Verdict = "passed"  // on the allow-list
	Refused Verdict = "refused" // off it, not sent
	Unsafe  Verdict = "unsafe"  // off it, sent because of --unsafe
)

// AuditEntry is one raw command in the audit logs, bounded whatever the
// command's size: long strings shortened, the whole kept as its size and
// SHA-256.
type AuditEntry struct {
	Time    time.Time `json:"time"`
	PID     int       `json:"pid"`
	UID     int       `json:"uid"`
	Verdict Verdict   `json:"verdict"`
	Execute string    `json:"execute,omitempty"`
	Class   string    `json:"class,omitempty"`  // of a refusal
	Reason  string    `json:"reason,omitempty"` // of a refusal
	Size    int       `json:"size"`
	SHA256  string    `json:"sha256"`
	// Command is the command with strings over maxAuditString bytes
	// shortened; if that is still over maxAuditCommand, a JSON string of
	// its head (Shortened says either happened).
	Command   json.RawMessage `json:"command"`
	Shortened bool            `json:"shortened,omitempty"`
}

// NewAuditEntry is the audit entry of command with its verdict (and the
// refusal, for a refused or --unsafe one).
func NewAuditEntry(v Verdict, refusal *Refusal, command []byte) AuditEntry {
	sum := sha256.Sum256(command)
	e := AuditEntry{Time: time.Now().UTC(), PID: os.Getpid(), UID: os.Getuid(), Verdict: v,
		Size: len(command), SHA256: hex.EncodeToString(sum[:])}
	if cmd, err := Parse(command); err == nil {
		e.Execute = cutString(cmd.Execute, 128)
	}
	if refusal != nil {
		e.Class, e.Reason = refusal.Class.String(), cutString(refusal.Reason, 1024)
	}
	e.Command, e.Shortened = auditCommand(command)
	return e
}

// auditCommand is command as an entry holds it (see AuditEntry).
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
