package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/dev/testenv/etcdtest"
)

// TestCLIJSON walks every command of the CLI with --json on a real guest
// and checks what it prints, errors included: a command the remote API
// answers too (cliAPIPairs) against its result's schema in
// remoteapi/openapi.json, the others against docs/cli-json.schema.json
// (every key present, no other). A command the walk misses fails it.
func TestCLIJSON(t *testing.T) {
	schema := cliSchemaFile(t)
	root, dir := t.TempDir(), t.TempDir()
	file := write(t, dir, "js.toml", strings.Replace(guestTOML("js", "[[nic]]\nname = \"net0\"\nforwards = [\"tcp:127.0.0.1:0-:22\"]\n"),
		`cmdline = "console=ttyS0 no_timer_check"`, `cmdline = "console=ttyS0 no_timer_check vmsup.dhcp"`, 1))
	covered := map[string]bool{}
	check := func(key string, wantCode int, args ...string) string {
		t.Helper()
		r := vmsup(t, root, "", append([]string{"--json"}, args...)...)
		if wantCode >= 0 && r.code != wantCode {
			t.Fatalf("%v: exit %d, want %d: %+v", args, r.code, wantCode, r)
		}
		valid, lines := schema.validator(t, key)
		docs := []string{r.stdout}
		if lines {
			docs = strings.Split(strings.TrimSpace(r.stdout), "\n")
		}
		for _, d := range docs {
			var v any
			if err := json.Unmarshal([]byte(d), &v); err != nil {
				t.Fatalf("%v: not JSON (%v):\n%s\nstderr: %s", args, err, r.stdout, r.stderr)
			}
			if err := valid(v); err != nil {
				t.Errorf("%v: %v\n%s", args, err, d)
			}
		}
		// (A stream's lines are compact.)
		if r.code != 0 && key != "error" && key != "exec" && !strings.Contains(r.stdout, `"error": {`) && !strings.Contains(r.stdout, `"error":{`) {
			t.Errorf("%v failed without a JSON error: %+v", args, r)
		}
		if key != "error" {
			covered[key] = true
		} else {
			covered[strings.Join(cmdPath(args), " ")] = true
		}
		return r.stdout
	}

	check("validate", 0, "validate", file)
	check("argv", 0, "argv", file)
	check("apparmor-profile", 0, "apparmor-profile", file)
	check("host", 0, "host")
	check("import", 0, "import", write(t, dir, "dom.xml", "<domain type='kvm'><name>imp</name><memory unit='MiB'>256</memory>"+
		"<os><type arch='x86_64' machine='q35'>hvm</type></os><devices><disk type='file'><source file='"+filepath.Join(root, "images", "imp.qcow2")+"'/>"+
		"<target dev='vda'/></disk><graphics type='vnc'/></devices></domain>"))
	check("version", 0, "version")
	check("up", 0, "up", file)
	defer vmsup(t, root, "", "kill", "js")
	waitAgent(t, root, "js")
	check("status", 0, "status", "js")
	check("ls", 0, "ls")
	check("export", 0, "export", "js")
	if out := check("plan", 0, "plan", file); !strings.Contains(out, `"in_sync": true`) {
		t.Errorf("plan of the file just brought up: %s", out)
	}
	check("apply", 0, "apply", file)
	check("events", 0, "events", "js")
	check("disk ls", 0, "disk", "ls", "js")
	check("nic ls", 0, "nic", "ls", "js")
	check("ping", 0, "ping", "js")
	check("exec", 3, "exec", "js", "--", "/bin/sh", "-c", "echo hi; exit 3")
	src := write(t, dir, "f.txt", "hello\n")
	check("cp", 0, "cp", src, "js:/tmp/f.txt")
	check("cp", 0, "cp", "js:/tmp/f.txt", filepath.Join(dir, "g.txt"))
	check("logs", 0, "logs", "js")
	check("stats", 0, "stats", "js")
	check("error", 2, "top", "js")
	check("error", 2, "metrics")
	check("error", 2, "api", "units")
	check("error", 1, "api", "serve", "--config", filepath.Join(dir, "none.toml"))
	check("error", 2, "api", "install")
	check("error", 2, "api", "cert", "c1", "--role", "operator", "--vms", "*")
	check("remote ls", 0, "remote", "ls")
	check("error", 2, "remote", "add", "r1")
	check("error", 1, "remote", "rm", "nosuch")
	check("set", 0, "set", "js", "--cpu-weight", "50")
	check("qmp", 0, "qmp", "js", `{"execute":"query-status"}`)
	check("pause", 0, "pause", "js")
	if out := check("error", 1, "screenshot", "js", filepath.Join(dir, "js.png")); !strings.Contains(out, "no [display]") {
		t.Errorf("screenshot of a VM without a display: %s", out)
	}
	check("resume", 0, "resume", "js")
	check("reset", 0, "reset", "js")
	waitAgent(t, root, "js")
	log := cliStatus(t, root, "js").ConsoleLog
	before, _ := os.ReadFile(log)
	boots := strings.Count(string(before), "VMSUP-SHELL-READY")
	check("reboot", 0, "reboot", "js")
	waitCount(t, log, "VMSUP-SHELL-READY", boots+1) // hot-unplug needs the guest's PCIe driver up again
	check("disk attach", 0, "disk", "attach", "js", "--file", filepath.Join(root, "images", "hot.qcow2"), "--size", "16M")
	// A snapshot of the attached disk, listed, not reverted while the VM
	// runs (no --force), and removed (a live commit back into hot.qcow2).
	check("snapshot create", 0, "snapshot", "create", "js", "s1", "--memory") // progress lines, then done
	check("snapshot ls", 0, "snapshot", "ls", "js")
	check("error", -1, "snapshot", "revert", "js", "s1")
	check("snapshot rm", 0, "snapshot", "rm", "js", "s1")
	check("disk move", 0, "disk", "move", "js", "hot", "--to", filepath.Join(root, "images", "hot2.qcow2"))
	// A full backup of the VM's disks (the attached one too), then one
	// restored.
	bdir := filepath.Join(dir, "backup")
	check("backup", 0, "backup", "js", "--to", bdir)
	check("restore", 0, "restore", bdir, "--disk", "hot", "--to", filepath.Join(dir, "hot-restored.qcow2"))
	check("disk detach", 0, "disk", "detach", "js", "hot")
	check("nic attach", 0, "nic", "attach", "js", "n2")
	check("nic detach", 0, "nic", "detach", "js", "n2")
	// No IOMMU here: host device hotplug answers with its JSON error.
	check("error", -1, "hostdev", "attach", "js", "0000:09:00.0")
	check("error", -1, "hostdev", "detach", "js", "0000:09:00.0")
	check("migrate", 0, "migrate", "js", "--local")
	// A running VM does not move (vmsup move is for shut-off VMs): its
	// failed event.
	if out := check("move", 1, "move", "js", "--to", "nowhere"); !strings.Contains(out, "vmsup migrate js --to HOST") {
		t.Errorf("move of a running VM: %s", out)
	}
	check("enable", 0, "enable", file)
	check("autostart", 0, "autostart")
	check("disable", 0, "disable", "js")
	check("restart", 0, "restart", "js")
	check("down", 0, "down", "js")
	check("kill", 0, "kill", "js")
	check("rm", 0, "rm", "js")
	// The fleet's commands, on a one-member etcd and no agent: nothing runs.
	etcd, err := etcdtest.Start(context.Background(), t.TempDir(), etcdtest.Options{Members: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	ep := "--etcd=" + strings.Join(etcd.Endpoints(), ",")
	check("fleet apply", 0, "fleet", "apply", ep, file)
	check("fleet ls", 0, "fleet", "ls", ep)
	check("fleet hosts", 0, "fleet", "hosts", ep)
	check("fleet drain", 0, "fleet", "drain", ep, "nohost")
	check("fleet uncordon", 0, "fleet", "uncordon", ep, "nohost")
	check("fleet rm", 0, "fleet", "rm", ep, "js")
	check("error", 2, "agent", ep, "--ttl", "1s")
	// Errors, as JSON objects.
	if out := check("error", 3, "status", "nosuch"); !strings.Contains(out, `"kind": "not-found"`) {
		t.Errorf("status nosuch: %s", out)
	}
	check("error", 2, "console", "js")
	check("error", 2, "vnc", "js")
	check("error", 1, "up", filepath.Join(dir, "none.toml"))
	check("error", 2, "bogus-command")
	// The image store: its list, a prune of nothing, and each verb's
	// one-line error (a real pull: internal/imagestore's tests).
	check("image ls", 0, "image", "ls")
	check("image prune", 0, "image", "prune")
	check("error", 1, "image", "rm", "nosuch")
	check("error", 1, "image", "pull", "http://127.0.0.1:9/none.qcow2", "--sha256", strings.Repeat("0", 64))
	// Managed networks: the list, and each verb's one-line error (making a
	// real network needs a namespace of the test's own: internal/net/netmanage).
	check("network ls", 0, "network", "ls")
	check("error", 1, "network", "create", filepath.Join(dir, "none.toml"))
	check("error", 1, "network", "up", "nosuch")
	check("error", 1, "network", "rm", "nosuch")

	// Every command of the tree was walked.
	var missing []string
	var walk func(c *cobra.Command, prefix string)
	walk = func(c *cobra.Command, prefix string) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			p := strings.TrimSpace(prefix + " " + sub.Name())
			if sub.HasAvailableSubCommands() {
				walk(sub, p)
				continue
			}
			if !covered[p] {
				missing = append(missing, p)
			}
		}
	}
	cmd, _ := newRoot()
	walk(cmd, "")
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("commands the JSON walk does not cover (add them, and their schema): %v", missing)
	}
}

// validator checks a --json document (or line, lines) of command key:
// against openapi.json for a command the API answers, else against
// docs/cli-json.schema.json.
func (s cliSchema) validator(t *testing.T, key string) (valid func(any) error, lines bool) {
	t.Helper()
	if api, lines := apiDocSchema(t, key); api != nil {
		return func(v any) error { return api.VisitJSON(v) }, lines
	}
	def, ok := s.Commands[key]
	if !ok {
		t.Fatalf("no schema for %q", key)
	}
	return func(v any) error { return validate(v, def, s.Defs, key) }, def["lines"] == true
}

// cmdPath is the command words of args (before the first argument that
// is not a known subcommand).
func cmdPath(args []string) []string {
	root, _ := newRoot()
	c, _, err := root.Find(args)
	if err != nil || c == root {
		return args[:1]
	}
	return strings.Fields(strings.TrimPrefix(c.CommandPath(), "vmsup "))
}

// validate checks v against the schema subset docs/cli-json.schema.json uses:
// $ref, type (with null), enum, properties (all required; additionalProperties
// false: no others), items.
func validate(v any, s map[string]any, defs map[string]map[string]any, at string) error {
	if types, ok := s["type"]; ok {
		if !typeOK(v, types) {
			return fmt.Errorf("%s: %s is not of type %v", at, jsonKind(v), types)
		}
		if v == nil {
			return nil
		}
	}
	if ref, ok := s["$ref"].(string); ok {
		def, ok := defs[strings.TrimPrefix(ref, "#/$defs/")]
		if !ok {
			return fmt.Errorf("%s: unknown $ref %s", at, ref)
		}
		if err := validate(v, def, defs, at); err != nil {
			return err
		}
	}
	if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
		return fmt.Errorf("%s: %v is not one of %v", at, v, enum)
	}
	if props, ok := s["properties"].(map[string]any); ok {
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %s", at, jsonKind(v))
		}
		for k, ps := range props {
			x, ok := obj[k]
			if !ok {
				return fmt.Errorf("%s: key %q missing", at, k)
			}
			if err := validate(x, ps.(map[string]any), defs, at+"."+k); err != nil {
				return err
			}
		}
		if s["additionalProperties"] == false {
			for k := range obj {
				if _, ok := props[k]; !ok {
					return fmt.Errorf("%s: key %q is not documented", at, k)
				}
			}
		}
	}
	if items, ok := s["items"].(map[string]any); ok {
		arr, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want an array, got %s", at, jsonKind(v))
		}
		for i, x := range arr {
			if err := validate(x, items, defs, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func typeOK(v any, types any) bool {
	list, ok := types.([]any)
	if !ok {
		list = []any{types}
	}
	for _, t := range list {
		if jsonKind(v) == t || t == "number" && jsonKind(v) == "integer" {
			return true
		}
	}
	return false
}

func jsonKind(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case float64:
		if x == math.Trunc(x) {
			return "integer"
		}
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}
