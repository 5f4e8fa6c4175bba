package qmppolicy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// call is one command being checked.
type call struct {
	env  Env
	cmd  string
	args map[string]any
	d    *Decision // collects the host files; nil when only checking
}

func (c *call) refuse(class Class, format string, a ...any) error {
	return &Refusal{Command: c.cmd, Class: class, Reason: fmt.Sprintf(format, a...)}
}

// sub is c checking another command's arguments (a transaction's action)
// under c's name.
func (c *call) sub(args map[string]any) *call {
	if args == nil {
		args = map[string]any{}
	}
	return &call{env: c.env, cmd: c.cmd, args: args, d: c.d}
}

// str is m[key] as a string; ok is false if it is absent or not a string.
func str(m map[string]any, key string) (string, bool) {
	s, ok := m[key].(string)
	return s, ok
}

// at prefixes a message with where in the arguments it applies ("" = the
// arguments themselves).
func at(where, msg string) string {
	if where == "" {
		return msg
	}
	return where + ": " + msg
}

// join is a nested field's name ("file", "backing.file").
func join(where, key string) string {
	if where == "" {
		return key
	}
	return where + "." + key
}

// path checks p, a host path QEMU will open, named field in the message:
// relative to QEMU's working directory if relative, it must be in the
// VM's state directory, also once the symlinks that exist are followed.
func (c *call) path(field, p string) error {
	if p == "" {
		return c.refuse(Form, "%s is empty", field)
	}
	state := filepath.Clean(c.env.StateDir)
	abs, rel := p, !filepath.IsAbs(p)
	if rel {
		if c.env.WorkDir == "" {
			return c.refuse(HostPath, "%s %q is relative to QEMU's working directory, which is unknown", field, short(p))
		}
		abs = filepath.Join(c.env.WorkDir, p)
	}
	abs = filepath.Clean(abs)
	switch {
	case !within(abs, state) && rel:
		return c.refuse(HostPath, "%s %q, relative to QEMU's working directory %s, is %s: outside the VM's state directory %s",
			field, short(p), c.env.WorkDir, abs, state)
	case !within(abs, state):
		return c.refuse(HostPath, "%s %q is a host path outside the VM's state directory %s", field, short(p), state)
	}
	real, err := resolve(abs)
	if err != nil {
		return c.refuse(HostPath, "%s %q: %v", field, short(p), err)
	}
	realState := state
	if r, err := filepath.EvalSymlinks(state); err == nil {
		realState = r
	}
	if !within(real, realState) {
		return c.refuse(HostPath, "%s %q leads through a symlink to %s, outside the VM's state directory %s", field, short(p), real, state)
	}
	return nil
}

// within reports whether the clean path p is dir or under it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/") || dir == "/"
}

// resolve follows the symlinks of the part of the absolute path p that
// exists; the rest is joined on as it is. A symlink that leads nowhere is
// an error: QEMU would create its target.
func resolve(p string) (string, error) {
	var rest []string
	for q := p; ; q = filepath.Dir(q) {
		if r, err := filepath.EvalSymlinks(q); err == nil {
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		if fi, err := os.Lstat(q); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			return "", fmt.Errorf("%s is a symlink to nothing", q)
		}
		if filepath.Dir(q) == q {
			return p, nil
		}
		rest = append([]string{filepath.Base(q)}, rest...)
	}
}

// abs is p as QEMU resolves it (its working directory for a relative p);
// only for a p that path passed.
func (c *call) abs(p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(c.env.WorkDir, p)
}

// isFDSet reports whether p names one of QEMU's fd sets (/dev/fdset/N):
// descriptors only vmsup adds (the CLI cannot pass one).
func isFDSet(p string) bool {
	n, ok := strings.CutPrefix(p, "/dev/fdset/")
	if !ok || n == "" {
		return false
	}
	_, err := strconv.ParseUint(n, 10, 31)
	return err == nil && strings.TrimLeft(n, "0123456789") == ""
}

// protocol is the protocol prefix of a block filename as QEMU finds it
// (path_has_protocol: a colon before any slash), "" if none.
func protocol(s string) string {
	i := strings.IndexAny(s, ":/\\")
	if i < 0 || s[i] != ':' {
		return ""
	}
	return s[:i]
}

// isNetworkProtocol reports whether a filename prefix or block driver
// reaches the network or a host socket.
func isNetworkProtocol(p string) bool {
	switch p {
	case "nbd", "http", "https", "ftp", "ftps", "ssh", "iscsi", "iser", "gluster", "rbd", "nfs", "sheepdog", "vxhs", "curl":
		return true
	}
	return strings.HasPrefix(p, "nbd+") || strings.HasPrefix(p, "gluster+")
}

// filename checks m[key], a block filename QEMU may parse for a protocol
// prefix: "json:{...}" is checked as the node it describes (dotted keys
// expanded), "file:" is stripped, network protocols and unknown ones are
// refused; the path that is left must pass path, and is a host file QEMU
// opens in mode. fdset allows /dev/fdset/N.
func (c *call) filename(m map[string]any, key, field string, depth int, fdset bool, mode Mode) error {
	s, _ := str(m, key)
	if fdset && isFDSet(s) {
		return nil
	}
	if rest, ok := strings.CutPrefix(s, "json:"); ok {
		node, err := c.jsonNode(field, rest)
		if err != nil {
			return err
		}
		if err := c.blockdev(node, field+` "json:"`, depth+1, mode); err != nil {
			return err
		}
		c.jsonFilename(m, key, node)
		return nil
	}
	switch proto := protocol(s); {
	case proto == "":
	case proto == "file":
		s = strings.TrimPrefix(s, "file:")
	case isNetworkProtocol(proto):
		return c.refuse(Outbound, "%s %q: protocol %q connects to the network or a host socket", field, short(s), proto)
	default:
		return c.refuse(Form, "%s %q: protocol prefix %q is not on the allow-list", field, short(s), proto)
	}
	if err := c.path(field, s); err != nil {
		return err
	}
	c.hostFile(m, key, field, s, mode)
	return nil
}

// jsonNode reads the object of a "json:" filename, dotted keys expanded.
func (c *call) jsonNode(field, rest string) (map[string]any, error) {
	node, err := parseObject(rest)
	if err != nil {
		return nil, c.refuse(Form, "%s: a \"json:\" filename that is not one JSON object: %v", field, err)
	}
	if node, err = expandDotted(node); err != nil {
		return nil, c.refuse(Form, "%s: a \"json:\" filename: %v", field, err)
	}
	return node, nil
}

// socketAddr checks a socket address (QAPI SocketAddress: type beside its
// fields) QEMU would listen on (class Listener) or connect to (Outbound):
// only a unix socket in the state directory passes.
func (c *call) socketAddr(field string, a map[string]any, class Class) error {
	t, _ := str(a, "type")
	switch t {
	case "unix":
		if abstract, _ := a["abstract"].(bool); abstract {
			return c.refuse(class, "%s: an abstract unix socket, which any local user can reach", field)
		}
		p, _ := str(a, "path")
		return c.path(field+" path", p)
	case "inet", "vsock":
		if class == Listener {
			return c.refuse(class, "%s: an %s socket: QEMU listens on the network", field, t)
		}
		return c.refuse(class, "%s: an %s socket: QEMU connects to the network", field, t)
	case "fd":
		return c.refuse(Descriptor, "%s: a file descriptor (vmsup's own, or QEMU's by number)", field)
	}
	return c.refuse(Form, "%s: socket type %q is not on the allow-list (unix)", field, short(t))
}

// socketAddrLegacy checks a SocketAddressLegacy ({"type", "data": {...}}).
func (c *call) socketAddrLegacy(field string, a map[string]any, class Class) error {
	data, _ := a["data"].(map[string]any)
	flat := map[string]any{"type": a["type"]}
	for k, v := range data {
		if k != "type" {
			flat[k] = v
		}
	}
	return c.socketAddr(field, flat, class)
}
