package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEmbedExample builds examples/embed, a program outside this module
// that embeds the library as an operator's tool would, and runs it against
// the sandbox systemd on a real guest: spec built in Go, up, wait, typed
// events around a pause and a resume, down. Then, left running, the VM's
// unit is stopped by systemd: the ExecStop= hook is that program, which
// handles it through supervisor.HandleHook (the guest powers off by ACPI).
func TestEmbedExample(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "embed")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = "../../examples/embed"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build examples/embed: %v\n%s", err, out)
	}
	root := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append([]string{"-root", root, "-systemd-bus", env.Systemd.BusAddress,
			"-kernel", env.Guest.Kernel, "-initrd", env.Guest.Initrd}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("embed %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := run("-name", "emb")
	for _, want := range []string{"up: running", "guest: vmsup test guest", "qmp: running", "event: STOP", "event: RESUME", "down: acpi"} {
		if !strings.Contains(out, want) {
			t.Errorf("embed output lacks %q:\n%s", want, out)
		}
	}

	run("-name", "emb2", "-leave-running")
	defer vmsup(t, root, "", "kill", "emb2")
	st := cliStatus(t, root, "emb2")
	waitCount(t, st.ConsoleLog, "VMSUP-GUEST-READY", 1)
	if show, _ := env.Systemd.Systemctl(ctx, "show", "-p", "ExecStop", "vmsup-emb2.service"); !strings.Contains(string(show), "'"+bin+"' 'stop-hook'") {
		t.Fatalf("the unit's stop hook is not the embedding program: %s", show)
	}
	if o, err := env.Systemd.Systemctl(ctx, "stop", "vmsup-emb2.service"); err != nil {
		t.Fatalf("systemctl stop: %v: %s", err, o)
	}
	j, _ := env.Systemd.Journal(ctx, "vmsup-emb2.service")
	if !strings.Contains(j, "stop-hook emb2: acpi") {
		t.Errorf("the embedding program's hook did not power the guest off by ACPI; journal:\n%s", j)
	}
	if b, _ := os.ReadFile(st.ConsoleLog); !strings.Contains(string(b), "reboot: Power down") {
		t.Errorf("the guest did not power off; console ends:\n%s", tail(string(b), 1000))
	}
}
