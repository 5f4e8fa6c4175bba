package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestCLIHelpAndCompletion: each command's help is about that command
// (examples, no global flag list); shell completion gives VM names, .toml
// files and enum values; --version names QEMU and systemd; make man's
// generator writes a page per command.
func TestCLIHelpAndCompletion(t *testing.T) {
	root, _ := newRoot()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Name() == "help" {
				continue
			}
			if sub.HasAvailableSubCommands() {
				walk(sub)
			}
			if sub.Example == "" && sub.Parent().Name() != "completion" && sub.Parent().Example == "" {
				t.Errorf("%s: no examples in its help", sub.CommandPath())
			}
		}
	}
	walk(root)
	if r := vmsup(t, t.TempDir(), "", "down", "--help"); r.code != 0 || strings.Contains(r.stdout, "--boot-target") || !strings.Contains(r.stdout, "Examples:") {
		t.Errorf("down --help repeats the global flags or lacks examples:\n%s", r.stdout)
	}

	state := t.TempDir()
	for _, n := range []string{"alpha", "beta"} {
		if err := os.MkdirAll(filepath.Join(state, "vms", n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if r := vmsup(t, state, "", "__complete", "status", ""); !strings.Contains(r.stdout, "alpha\nbeta\n") {
		t.Errorf("completion of VM names: %+v", r)
	}
	if r := vmsup(t, state, "", "__complete", "status", "al"); strings.Contains(r.stdout, "beta") || !strings.Contains(r.stdout, "alpha") {
		t.Errorf("completion of a prefix: %+v", r)
	}
	if r := vmsup(t, state, "", "__complete", "reboot", "--mode", ""); !strings.Contains(r.stdout, "agent\nacpi\n") {
		t.Errorf("completion of --mode: %+v", r)
	}
	if r := vmsup(t, state, "", "__complete", "up", ""); !strings.Contains(r.stdout, "toml\n:8") { // ShellCompDirectiveFilterFileExt
		t.Errorf("completion of up's files: %+v", r)
	}

	if r := vmsup(t, state, "", "--version"); r.code != 0 || !strings.HasPrefix(r.stdout, "vmsup ") || !strings.Contains(r.stdout, "QEMU emulator version") || !strings.Contains(r.stdout, "systemd ") {
		t.Errorf("--version: %+v", r)
	}
	man := t.TempDir()
	if r := vmsup(t, state, "", "gen-man", man); r.code != 0 {
		t.Fatalf("gen-man: %+v", r)
	}
	for _, page := range []string{"vmsup.1", "vmsup-up.1", "vmsup-disk-attach.1", "vmsup-exec.1"} {
		if b, err := os.ReadFile(filepath.Join(man, page)); err != nil || !strings.Contains(string(b), ".SH") {
			t.Errorf("man page %s: %v", page, err)
		}
	}
}
