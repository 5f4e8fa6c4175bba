package qmppolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Class is what a refused command would have done: the reason a caller
// branches on.
type Class int

// The classes of refusal.
const (
	NotListed  Class = iota + 1 // the command is not on the allow-list
	Listener                    // QEMU would listen on the network or a socket others reach
	Outbound                    // QEMU would connect to the network or a host socket
	HostPath                    // a host path outside the VM's state directory
	Program                     // QEMU would run a program (its seccomp filter kills it for that)
	Export                      // the guest's disk or memory served or sent outside QEMU
	Descriptor                  // a file descriptor by number, or one vmsup passes for itself
	Ends                        // it ends QEMU without vmsup's stop steps
	Form                        // an argument form the allow-list does not know
	Malformed                   // not one QMP command
)

func (c Class) String() string {
	switch c {
	case NotListed:
		return "not-listed"
	case Listener:
		return "listener"
	case Outbound:
		return "outbound"
	case HostPath:
		return "host-path"
	case Program:
		return "program"
	case Export:
		return "export"
	case Descriptor:
		return "descriptor"
	case Ends:
		return "ends"
	case Form:
		return "form"
	case Malformed:
		return "malformed"
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// Refusal is why the policy refuses a command.
type Refusal struct {
	Command string // its "execute" ("" if it has none)
	Class   Class
	Reason  string // for people, without the command's name
	// Err is the error behind the refusal where there is one (a file the
	// caller opened for the command and refused: storage.ErrHardLinked,
	// os.ErrPermission); nil for the policy's own.
	Err error
}

// Unwrap is the error behind the refusal, if any.
func (r *Refusal) Unwrap() error { return r.Err }

func (r *Refusal) Error() string {
	if r.Command == "" {
		return fmt.Sprintf("refused: %s (vmsup qmp --unsafe passes it)", r.Reason)
	}
	return fmt.Sprintf("refused %q: %s (vmsup qmp --unsafe passes it)", r.Command, r.Reason)
}

// Env is what the checkers know of the VM's QEMU.
type Env struct {
	// StateDir is the VM's state directory: the only host paths a raw
	// command may name are in it.
	StateDir string
	// WorkDir is QEMU's working directory as QEMU sees it (its
	// /proc/PID/cwd); relative paths resolve against it. "" = unknown:
	// relative paths are refused.
	WorkDir string
	// Taps are the host taps vmsup made for this VM's NICs: the only ones
	// a raw netdev_add of type tap may open.
	Taps []string
}

// Command is a parsed raw command.
type Command struct {
	Execute   string
	Arguments map[string]any // nil if it has none
	ID        any            // its "id", nil if it has none
}

// Check returns nil if the raw command (one QMP JSON object) passes the
// allow-list for a QEMU described by env, else a *Refusal.
func Check(raw []byte, env Env) error {
	cmd, err := Parse(raw)
	if err != nil {
		return err
	}
	r := lookup(cmd.Execute)
	if r == nil {
		return refuseUnlisted(cmd.Execute)
	}
	if r.check == nil {
		return nil
	}
	c := &call{env: env, cmd: cmd.Execute, args: cmd.Arguments}
	if c.args == nil {
		c.args = map[string]any{}
	}
	return r.check(c)
}

// Parse reads one raw QMP command strictly: valid UTF-8 JSON, one object
// with "execute" (a string), optional "arguments" (an object) and "id", no
// duplicate keys at any depth, no NUL in a string: where QEMU's parser and
// Go's could disagree, the command is refused. Errors are *Refusal of class
// Malformed.
func Parse(raw []byte) (Command, error) {
	bad := func(format string, a ...any) (Command, error) {
		return Command{}, &Refusal{Class: Malformed, Reason: "not a QMP command: " + fmt.Sprintf(format, a...)}
	}
	if !utf8.Valid(raw) {
		return bad("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return bad("%v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return bad("more than one JSON value")
	}
	top, ok := v.(map[string]any)
	if !ok {
		return bad("not a JSON object")
	}
	var cmd Command
	for k, e := range top {
		switch k {
		case "execute":
			s, ok := e.(string)
			if !ok || s == "" {
				return bad(`"execute" is not a command name`)
			}
			cmd.Execute = s
		case "arguments":
			a, ok := e.(map[string]any)
			if !ok {
				return bad(`"arguments" is not an object`)
			}
			cmd.Arguments = a
		case "id":
			cmd.ID = e
		default:
			return bad("key %q (only execute, arguments and id)", short(k))
		}
	}
	if cmd.Execute == "" {
		return bad(`no "execute"`)
	}
	return cmd, nil
}

// maxDepth bounds how deep a command nests.
const maxDepth = 32

// decodeValue reads one JSON value from dec, refusing duplicate keys and
// NUL characters.
func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested more than %d deep", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string) // the decoder only gives a string here
				if _, dup := m[k]; dup {
					return nil, fmt.Errorf("duplicate key %q", short(k))
				}
				if m[k], err = decodeValue(dec, depth+1); err != nil {
					return nil, err
				}
			}
			_, err := dec.Token()
			return m, err
		case '[':
			var l []any
			for dec.More() {
				e, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				l = append(l, e)
			}
			_, err := dec.Token()
			return l, err
		}
		return nil, errors.New("unexpected " + t.String())
	case string:
		if strings.ContainsRune(t, 0) {
			return nil, errors.New("a NUL character in a string")
		}
		return t, nil
	}
	return tok, nil
}

// short is s for a message: at most 64 bytes.
func short(s string) string {
	if len(s) <= 64 {
		return s
	}
	cut := 60
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
