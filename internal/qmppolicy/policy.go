// Package qmppolicy decides which raw QMP commands "vmsup qmp" passes to a
// VM's QEMU. vmsup confines QEMU (its own user, a sandbox, grants on just
// the VM's files), but QMP can ask QEMU to step outside of that: open a
// host listener (HMP gdbserver, hostfwd_add, a chardev on a TCP socket),
// read or write host files (a file chardev, a memory-backend-file, a
// secret or dump file), or run a program (migrate "exec:", which the
// seccomp sandbox answers by killing QEMU). Those are refused unless the
// operator says --unsafe; every other command passes.
package qmppolicy

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// Check returns nil if the raw command (one QMP JSON object) may be passed
// to a QEMU whose own files are under stateDir, else why not.
func Check(raw []byte, stateDir string) error {
	var cmd struct {
		Execute   string         `json:"execute"`
		Arguments map[string]any `json:"arguments"`
	}
	if err := json.Unmarshal(raw, &cmd); err != nil {
		return fmt.Errorf("not a QMP command: %w", err)
	}
	if cmd.Execute == "" {
		return fmt.Errorf(`not a QMP command: no "execute"`)
	}
	switch cmd.Execute {
	case "human-monitor-command":
		// HMP can do anything QMP can and more (gdbserver, hostfwd_add);
		// its "info" commands only read.
		line, _ := cmd.Arguments["command-line"].(string)
		if f := strings.Fields(line); len(f) == 0 || f[0] != "info" {
			return refuse(cmd.Execute, fmt.Sprintf("HMP %q: only \"info ...\" passes", line))
		}
		return nil
	case "migrate", "migrate-incoming":
		uri, _ := cmd.Arguments["uri"].(string)
		if scheme, _, _ := strings.Cut(uri, ":"); scheme == "exec" || scheme == "rdma" || scheme == "fd" {
			return refuse(cmd.Execute, fmt.Sprintf("uri %q runs a program or uses a descriptor outside vmsup (QEMU's seccomp filter kills it); vmsup migrate moves VMs", uri))
		}
	case "chardev-add", "chardev-change":
		if t := backendType(cmd.Arguments); t == "socket" || t == "udp" {
			if addrType(cmd.Arguments) != "unix" {
				return refuse(cmd.Execute, "a network socket chardev opens the host to the network")
			}
		}
	case "quit":
		return refuse(cmd.Execute, "it ends the VM without its stop steps: use vmsup down")
	}
	if p := outsidePath(cmd.Execute, "", cmd.Arguments, filepath.Clean(stateDir)); p != "" {
		return refuse(cmd.Execute, fmt.Sprintf("it names %s, a host path outside the VM's state directory %s", p, stateDir))
	}
	return nil
}

func refuse(cmd, why string) error {
	return fmt.Errorf("refused %q: %s (vmsup qmp --unsafe passes it)", cmd, why)
}

// backendType is a chardev-add's backend type.
func backendType(args map[string]any) string {
	b, _ := args["backend"].(map[string]any)
	t, _ := b["type"].(string)
	return t
}

// addrType is a socket chardev's address type ("unix", "inet", ...).
func addrType(args map[string]any) string {
	b, _ := args["backend"].(map[string]any)
	data, _ := b["data"].(map[string]any)
	addr, _ := data["addr"].(map[string]any)
	t, _ := addr["type"].(string)
	return t
}

// outsidePath returns the first string in v that names a host path outside
// dir: an absolute path, or one behind a "file:" prefix. QOM paths
// ("/machine/peripheral/disk-a") look alike but name QEMU's objects: they
// are the "path" of the qom-* commands, any "qom-path", and device_del's id.
func outsidePath(execute, key string, v any, dir string) string {
	switch x := v.(type) {
	case string:
		if key == "qom-path" || key == "path" && strings.HasPrefix(execute, "qom-") || key == "id" && execute == "device_del" {
			return ""
		}
		p := strings.TrimPrefix(x, "file:")
		if !filepath.IsAbs(p) {
			return ""
		}
		if c := filepath.Clean(p); c == dir || strings.HasPrefix(c, dir+"/") {
			return ""
		}
		return p
	case map[string]any:
		for k, e := range x {
			if p := outsidePath(execute, k, e, dir); p != "" {
				return p
			}
		}
	case []any:
		for _, e := range x {
			if p := outsidePath(execute, key, e, dir); p != "" {
				return p
			}
		}
	}
	return ""
}
