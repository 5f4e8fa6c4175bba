package qemuargs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Error is an invalid VM description or option set. Field uses spec's field
// syntax ("disk[1].cache", "boot.kernel"), so a caller holding the
// *spec.File can turn it into a positioned error with File.Errorf; problems
// with Options name the option ("Options.QMPSocket").
//
// Errors from the per-device helpers (Disk, NICNetdev) carry the
// device in Object ("disk \"data\"") and a Field relative to it ("cache");
// Build replaces both with VM and the full field path.
type Error struct {
	VM     string // VM name; empty from the per-device helpers
	Object string // `disk "data"`, `nic "lan"`; empty when Field is a full path
	Field  string
	Msg    string
}

func (e *Error) Error() string {
	var parts []string
	if e.VM != "" {
		parts = append(parts, fmt.Sprintf("vm %q", e.VM))
	}
	if e.Object != "" {
		parts = append(parts, e.Object)
	}
	if e.Field != "" {
		parts = append(parts, e.Field)
	}
	parts = append(parts, e.Msg)
	return strings.Join(parts, ": ")
}

func errorf(field, format string, args ...any) *Error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// checkString rejects strings QEMU's command line (and the one-argument-per-
// line golden files and systemd unit files) cannot carry faithfully.
func checkString(s string) error {
	switch {
	case !utf8.ValidString(s):
		return fmt.Errorf("%q is not valid UTF-8", s)
	case strings.ContainsAny(s, "\n\r\x00"):
		return fmt.Errorf("%q contains a newline, carriage return or NUL", s)
	}
	return nil
}

// escapeValue makes s safe as the value in a QEMU key=value option list
// ("-chardev socket,path=VALUE"): QEMU ends a value at a single comma and
// reads a doubled comma as a literal one. Values QEMU cannot take at all are
// errors.
func escapeValue(s string) (string, error) {
	if err := checkString(s); err != nil {
		return "", err
	}
	return strings.ReplaceAll(s, ",", ",,"), nil
}

// marshalJSON encodes v compactly without HTML escaping, so paths with '&'
// or '<' stay readable in argv and golden files.
func marshalJSON(v any) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
