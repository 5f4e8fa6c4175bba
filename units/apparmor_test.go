package units_test

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/units"
)

var update = flag.Bool("update", false, "rewrite testdata/apparmor/*.profile")

// needParser fails the test unless apparmor_parser and the pinned feature
// ABI are installed: golden profiles are only worth something compiled.
func needParser(t *testing.T) units.Parser {
	t.Helper()
	if _, err := exec.LookPath("apparmor_parser"); err != nil {
		t.Fatal("apparmor_parser missing: install apparmor apparmor-utils (scripts/install-deps.sh)")
	}
	if _, err := os.Stat("/usr/share/apparmor-features/features"); err != nil {
		t.Fatalf("feature ABI missing: %v (package apparmor)", err)
	}
	return units.Parser{}
}

func baseProfile(name string) *units.Profile {
	return &units.Profile{
		Name: "vmsup-" + name, Binary: "/usr/bin/qemu-system-x86_64", Network: true,
		Rules: []units.PathRule{
			{Path: "/var/lib/vmsup/vms/" + name + "/", Mode: "rwk"},
			{Path: "/var/lib/vmsup/images/vmlinux", Mode: "r"},
		},
	}
}

// TestProfileGolden renders the per-VM profiles (a plain disk, a 3-file
// backing chain, a disk hot-plugged and then detached, paths with spaces,
// quotes, commas and AppArmor glob characters) into golden files and
// compiles every one with apparmor_parser against the pinned feature ABI.
func TestProfileGolden(t *testing.T) {
	parser := needParser(t)
	chain := baseProfile("chain")
	for _, r := range []units.PathRule{
		{Path: "/var/lib/vmsup/images/top.qcow2", Mode: "rwk"},
		{Path: "/var/lib/vmsup/images/mid.qcow2", Mode: "rk"},
		{Path: "/var/lib/vmsup/images/base.qcow2", Mode: "rk"},
	} {
		if err := chain.AddPath(r); err != nil {
			t.Fatal(err)
		}
	}
	hot := baseProfile("hotplug")
	_ = hot.AddPath(units.PathRule{Path: "/var/lib/vmsup/images/root.raw", Mode: "rwk"})
	_ = hot.AddPath(units.PathRule{Path: "/var/lib/vmsup/images/hot.qcow2", Mode: "rwk"})
	_ = hot.AddPath(units.PathRule{Path: "/var/lib/vmsup/images/hot-base.qcow2", Mode: "rk"})
	unplugged := baseProfile("hotplug")
	*unplugged = *hot
	unplugged.Rules = append([]units.PathRule(nil), hot.Rules...)
	if !unplugged.RemovePath("/var/lib/vmsup/images/hot.qcow2") || !unplugged.RemovePath("/var/lib/vmsup/images/hot-base.qcow2") {
		t.Fatal("RemovePath found nothing")
	}
	odd := baseProfile("odd")
	odd.Network = false
	for _, p := range []string{
		`/var/lib/vmsup/images/with space.raw`,
		`/var/lib/vmsup/images/quote"d,comma.raw`,
		`/var/lib/vmsup/images/glob*?[x]{a,b}^.raw`,
		`/var/lib/vmsup/images/@{HOME}\back.raw`,
	} {
		if err := odd.AddPath(units.PathRule{Path: p, Mode: "rwk"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		p    *units.Profile
	}{{"plain", baseProfile("plain")}, {"chain", chain}, {"hotplug", hot}, {"hotplug-detached", unplugged}, {"odd-paths", odd}} {
		t.Run(c.name, func(t *testing.T) {
			text, err := c.p.Render()
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("..", "testdata", "apparmor", c.name+".profile")
			if *update {
				if err := os.WriteFile(golden, text, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./units -run TestProfileGolden -update)", err)
			}
			if diff := cmp.Diff(string(want), string(text)); diff != "" {
				t.Errorf("profile %s differs from %s:\n%s", c.name, golden, diff)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := parser.Compile(ctx, golden); err != nil {
				t.Fatalf("profile does not compile: %v", err)
			}
		})
	}
	// The escaped odd paths come out literal: no glob, no variable.
	text, _ := odd.Render()
	for _, want := range []string{`"/var/lib/vmsup/images/quote\"d,comma.raw" rwk,`,
		`"/var/lib/vmsup/images/glob\*\?\[x\]\{a,b\}\^.raw" rwk,`, `"/var/lib/vmsup/images/@\{HOME\}\\back.raw" rwk,`} {
		if !strings.Contains(string(text), want) {
			t.Errorf("rendered profile lacks %s", want)
		}
	}
}

// TestProfileRefuses: what a profile cannot express exactly is an error.
func TestProfileRefuses(t *testing.T) {
	p := baseProfile("x")
	for _, r := range []units.PathRule{
		{Path: "relative.raw", Mode: "rw"},
		{Path: "/a/../etc/shadow", Mode: "r"},
		{Path: "/a/tab\there.raw", Mode: "rw"},
		{Path: "/a/nl\nhere.raw", Mode: "rw"},
		{Path: "/a/ok.raw", Mode: "rwx"},
		{Path: "/a/ok.raw", Mode: "ix"},
	} {
		if err := p.AddPath(r); err == nil {
			t.Errorf("AddPath(%q, %q) accepted", r.Path, r.Mode)
		}
	}
	for _, n := range []string{"", "a b", "x/y", "a\"b"} {
		if _, err := (&units.Profile{Name: n, Binary: "/usr/bin/qemu-system-x86_64"}).Render(); err == nil {
			t.Errorf("profile name %q accepted", n)
		}
	}
	if err := p.AddPath(units.PathRule{Path: "/var/lib/vmsup/images/vmlinux", Mode: "rk"}); err != nil || len(p.Rules) != 2 {
		t.Errorf("AddPath of a known path should replace its mode: %v %+v", err, p.Rules)
	}
}

// TestUnloadMissingProfile: removing a profile the kernel does not have
// (a record from before the host's reboot) succeeds; other failures do
// not. AppArmor is off in this kernel, so a stand-in answers as
// apparmor_parser 3.0 does on Debian 12 (seen in the real-host test).
func TestUnloadMissingProfile(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"gone":   `echo 'apparmor_parser: Unable to remove "vmsup-demo".  Profile doesn'"'"'t exist' >&2; exit 254`,
		"broken": `echo 'apparmor_parser: Unable to remove "vmsup-demo".  Permission denied' >&2; exit 254`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := (units.Parser{Binary: filepath.Join(dir, "gone")}).Unload(ctx, "/x/demo.apparmor"); err != nil {
		t.Errorf("unload of a profile the kernel does not have: %v", err)
	}
	if err := (units.Parser{Binary: filepath.Join(dir, "broken")}).Unload(ctx, "/x/demo.apparmor"); err == nil {
		t.Error("unload that the parser refused: no error")
	}
}
