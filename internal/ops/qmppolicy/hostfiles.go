package qmppolicy

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// A check on a name is a check on nothing: between the check and QEMU's
// open, a symlink can be swapped, and a hard link passes any name check.
// So a passed command that has QEMU open a file of the state directory by
// name says so (Decision.Files): the caller opens the file itself, checks
// the object, and gives QEMU the descriptor (/dev/fdset/N) in its place.

// Mode is how QEMU would open a host file.
type Mode int

// The modes.
const (
	ReadOnly  Mode = iota + 1
	ReadWrite      // QEMU may still open it read-only (a backing child, auto-read-only)
	// MediumMode is blockdev-change-medium's "retain": the mode of the
	// device's medium (HostFile.Device), as QEMU has it.
	MediumMode
)

func (m Mode) String() string {
	switch m {
	case ReadOnly:
		return "read-only"
	case ReadWrite:
		return "read-write"
	case MediumMode:
		return "the medium's"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// HostFile is a file of the VM's state directory a passed command has
// QEMU open by name.
type HostFile struct {
	Path   string // absolute, in the state directory, as QEMU resolves it
	Field  string // where in the arguments, for messages
	Mode   Mode
	Device string // MediumMode: the command's "id" (a qdev id) or else "device"
	set    func(string)
}

// Replace makes the command name fd (a /dev/fdset/N) instead of the file.
func (f *HostFile) Replace(fd string) { f.set(fd) }

// Decision is how a passed command goes to QEMU.
type Decision struct {
	Command Command // as checked: block options with dotted keys expanded
	Files   []*HostFile
	// renders re-write the "json:" filenames from their checked (and
	// replaced) objects, innermost first.
	renders []func() error
}

// Decide checks raw like Check and, for a command that passes, says which
// host files it has QEMU open (to be passed as descriptors) and gives the
// checked form to send (Encode). Errors are *Refusal.
func Decide(raw []byte, env Env) (*Decision, error) {
	cmd, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	d := &Decision{Command: cmd}
	r := lookup(cmd.Execute)
	if r == nil {
		return nil, refuseUnlisted(cmd.Execute)
	}
	if r.check == nil {
		return d, nil
	}
	c := &call{env: env, cmd: cmd.Execute, args: cmd.Arguments, d: d}
	if c.args == nil {
		c.args = map[string]any{}
	}
	if err := r.check(c); err != nil {
		return nil, err
	}
	d.Command.Arguments = c.args
	return d, nil
}

// Encode is the command to send: the checked form, with the files'
// replacements.
func (d *Decision) Encode() ([]byte, error) {
	for i := len(d.renders) - 1; i >= 0; i-- {
		if err := d.renders[i](); err != nil {
			return nil, err
		}
	}
	out := map[string]any{"execute": d.Command.Execute}
	if d.Command.Arguments != nil {
		out["arguments"] = d.Command.Arguments
	}
	if d.Command.ID != nil {
		out["id"] = d.Command.ID
	}
	return marshal(out)
}

// marshal is v as JSON without HTML escaping (what was checked, byte for
// byte where it can be).
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// hostFile records that the filename at m[key] (already checked) is the
// state directory file p, opened in mode.
func (c *call) hostFile(m map[string]any, key, field, p string, mode Mode) {
	if c.d == nil {
		return
	}
	f := &HostFile{Path: c.abs(p), Field: field, Mode: mode, set: func(fd string) { m[key] = fd }}
	if mode == MediumMode {
		if f.Device, _ = str(c.args, "id"); f.Device == "" {
			f.Device, _ = str(c.args, "device")
		}
	}
	c.d.Files = append(c.d.Files, f)
}

// jsonFilename records that m[key] is a "json:" filename for node, to be
// written again from node when the command is encoded.
func (c *call) jsonFilename(m map[string]any, key string, node map[string]any) {
	if c.d == nil || m == nil {
		return
	}
	c.d.renders = append(c.d.renders, func() error {
		b, err := marshal(node)
		if err != nil {
			return err
		}
		m[key] = "json:" + string(b)
		return nil
	})
}
