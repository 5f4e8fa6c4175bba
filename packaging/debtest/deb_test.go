// Package debtest builds vmsup's Debian package (make deb,
// scripts/build-deb.sh), checks what it holds and declares, and installs and
// removes it in a throwaway root. The real install, on a Debian 12 host
// with systemd as PID 1 and VMs running, is supervisor/realhosttest's.
package debtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// shipped are files the package must hold (besides the man pages).
var shipped = []string{
	"./usr/bin/vmsup",
	"./usr/share/man/man1/vmsup.1.gz", "./usr/share/man/man1/vmsup-up.1.gz",
	"./usr/share/bash-completion/completions/vmsup",
	"./usr/share/zsh/vendor-completions/_vmsup",
	"./usr/share/fish/vendor_completions.d/vmsup.fish",
	"./lib/systemd/system/vmsup.service",
	"./lib/systemd/system/vmsup-metrics.socket", "./lib/systemd/system/vmsup-metrics@.service",
	"./lib/systemd/system/vmsup-metrics-collect.socket", "./lib/systemd/system/vmsup-metrics-collect@.service",
	"./lib/systemd/system/vmsup-api.socket", "./lib/systemd/system/vmsup-api.service",
	"./usr/lib/sysusers.d/vmsup.conf", "./usr/lib/tmpfiles.d/vmsup.conf",
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestDebPackage(t *testing.T) {
	testenv.SkipUnlessRoot(t) // dpkg --root installs files owned by root
	for _, bin := range []string{"dpkg", "dpkg-deb", "systemd-sysusers", "systemd-tmpfiles"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (Debian's dpkg and systemd): cannot build or install the package", bin)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	deb, err := testenv.BuildDeb(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %s", filepath.Base(deb), time.Since(t0).Round(time.Millisecond))

	info := run(t, "dpkg-deb", "-I", deb)
	for _, want := range []string{"Package: vmsup", "Architecture: amd64", "qemu-system-x86 (>= 1:7.2)",
		"qemu-utils", "systemd (>= 252)", "Recommends: apparmor", " postinst", " prerm", " postrm"} {
		if !strings.Contains(info, want) {
			t.Errorf("dpkg-deb -I: no %q in\n%s", want, info)
		}
	}
	version := strings.TrimSpace(run(t, "dpkg-deb", "-f", deb, "Version"))
	contents := run(t, "dpkg-deb", "-c", deb)
	files := map[string]bool{}
	for _, line := range strings.Split(contents, "\n") {
		if f := strings.Fields(line); len(f) >= 6 {
			if f[1] != "root/root" {
				t.Errorf("dpkg-deb -c: %s is owned by %s, not root/root", f[5], f[1])
			}
			files[f[5]] = true
		}
	}
	for _, f := range shipped {
		if !files[f] {
			t.Errorf("dpkg-deb -c: %s missing", f)
		}
	}
	for f := range files {
		if strings.HasPrefix(f, "./etc/") && !strings.HasSuffix(f, "/") {
			t.Errorf("dpkg-deb -c: %s: the package ships no configuration (vmsup's commands write /etc/systemd/system)", f)
		}
	}
	checkScripts(t, deb)
	installInRoot(t, deb, version)
}

// checkScripts: no maintainer script stops, restarts, kills or disables a
// VM's unit, or the boot unit: removing or upgrading the package leaves
// running VMs alone (the real-host test removes it under a running VM).
func checkScripts(t *testing.T, deb string) {
	dir := t.TempDir()
	run(t, "dpkg-deb", "-e", deb, dir)
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		b, err := os.ReadFile(filepath.Join(dir, s))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") {
				continue
			}
			for _, verb := range []string{"stop", "restart", "kill", "disable", "try-restart", "isolate"} {
				if strings.Contains(line, "systemctl "+verb) && !strings.Contains(line, `"$u"`) {
					t.Errorf("%s: %q acts on units beyond the API's and metrics' sockets", s, line)
				}
			}
		}
	}
	prerm, _ := os.ReadFile(filepath.Join(dir, "prerm"))
	for _, line := range strings.Split(string(prerm), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") && strings.Contains(line, ".service") {
			t.Errorf("prerm: %q names a service; it may stop only vmsup-api.socket and the metrics sockets", line)
		}
	}
}

// installInRoot installs the package into an empty root (dpkg --root, the
// maintainer scripts run outside it with DPKG_ROOT set), runs the installed
// vmsup, and removes the package again: the state root stays.
func installInRoot(t *testing.T, deb, version string) {
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "etc", "lib", "usr/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dpkg := func(args ...string) string {
		return run(t, "dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--force-depends",
			"--log=/dev/null"}, args...)...)
	}
	t0 := time.Now()
	dpkg("-i", deb)
	t.Logf("dpkg --root -i in %s", time.Since(t0).Round(time.Millisecond))
	out := run(t, filepath.Join(root, "usr/bin/vmsup"), "--version")
	t.Logf("installed vmsup --version:\n%s", out)
	if first, _, _ := strings.Cut(out, "\n"); first != "vmsup "+version {
		t.Errorf("vmsup --version says %q, the package is %s", first, version)
	}
	if st := dpkg("-s", "vmsup"); !strings.Contains(st, "Status: install ok installed") {
		t.Errorf("dpkg -s vmsup after -i:\n%s", st)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil || !strings.Contains(string(passwd), "vmsup-qemu:") {
		t.Errorf("postinst (systemd-sysusers) made no vmsup-qemu user in the root's /etc/passwd (%v):\n%s", err, passwd)
	}
	if fi, err := os.Stat(filepath.Join(root, "var/lib/vmsup")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("postinst (systemd-tmpfiles) made no 0755 /var/lib/vmsup: %v", err)
	}
	// A record vmsup made, which removal must keep.
	keep := filepath.Join(root, "var/lib/vmsup/kept")
	if err := os.WriteFile(keep, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	dpkg("-r", "vmsup")
	if _, err := os.Stat(filepath.Join(root, "usr/bin/vmsup")); err == nil {
		t.Error("dpkg -r left /usr/bin/vmsup")
	}
	dpkg("-P", "vmsup")
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("dpkg -r/-P removed vmsup's state root: %v", err)
	}
}
