package remotetest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
)

// TestRemoteEnrol: the API set up with vmsup's own commands only: api
// install (its units carry --root and the other global flags), api cert
// for an operator of web* and a read-only client, remote add on the
// client; the operator's --remote NAME drives up, ls and console over
// mutual TLS, the read-only one is refused down. While the API server
// runs, status, down and kill api refuse and leave it running, ls lists
// no VM api, and validate refuses every name vmsup's own units have.
func TestRemoteEnrol(t *testing.T) {
	testenv.SkipUnlessRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sdDir, err := os.MkdirTemp("", "vmsup-en-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sdDir) })
	sd, err := testenv.StartSystemd(ctx, sdDir) // this test's network namespace: loopback is its own
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sd.Stop() })
	root, dir := t.TempDir(), t.TempDir()
	hostEnv := append([]string{"VMSUP_ROOT=" + root, "VMSUP_SYSTEMD_BUS=" + sd.BusAddress, "VMSUP_JOURNAL_DIR=" + sd.JournalDir,
		"VMSUP_UNIT_DIR=" + sd.UnitDir, "VMSUP_BOOT_TARGET=" + testenv.BootTarget, "VMSUP_RUN_DIR=" + filepath.Join(root, "run")}, env.CLIEnv()...)
	local := func(args ...string) result { t.Helper(); return run(t, hostEnv, args...) }
	addr := freeAddr(t)
	url := "https://" + addr

	if r := local("--root", "/x", "--image-dir", "/x/images", "api", "units"); r.code != 0 || !strings.Contains(r.stdout, " --root=/x ") || !strings.Contains(r.stdout, " --image-dir=/x/images ") {
		t.Errorf("api units does not carry --root and --image-dir: %+v", r)
	}
	// ...and reads the configuration api install makes (/x has none, and
	// neither has this host /etc/vmsup/remote.toml, or the test says so).
	if _, err := os.Stat("/etc/vmsup/remote.toml"); err == nil {
		t.Log("this host has /etc/vmsup/remote.toml: api units' default is not checked")
	} else if r := local("--root", "/x", "api", "units"); !strings.Contains(r.stdout, " api serve --config /x/remote/remote.toml") {
		t.Errorf("api units does not name ROOT/remote/remote.toml, the file api install and api cert use: %+v", r)
	}
	start := time.Now()
	if r := local("--root", root, "-v", "api", "install", "--listen", addr, "--socket", "", "--url", url); r.code != 0 {
		t.Fatalf("api install: %+v", r)
	}
	t.Logf("api install: %v", time.Since(start).Round(time.Millisecond))
	checkInstalled(t, sd.UnitDir, root)
	op, view := filepath.Join(dir, "op.bundle"), filepath.Join(dir, "view.bundle")
	if r := local("api", "cert", "op", "--role", "operator", "--vms", "web*", "--out", op); r.code != 0 || !strings.Contains(r.stderr, "cn:op: granted operator for web*") {
		t.Fatalf("api cert op: %+v", r)
	}
	r := local("api", "cert", "view", "--role", "read-only", "--vms", "*")
	if r.code != 0 || os.WriteFile(view, []byte(r.stdout), 0o600) != nil {
		t.Fatalf("api cert view: %+v", r)
	}
	if st, err := os.Stat(op); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the bundle %s: %v, %v; want 0600", op, st.Mode(), err)
	}
	if r := local("api", "cert", "x", "--role", "boss", "--vms", "*"); r.code != 2 || !strings.Contains(r.stderr, `--role "boss": want read-only, operator or admin`) {
		t.Errorf("api cert --role boss: %+v", r)
	}

	client := []string{"XDG_CONFIG_HOME=" + t.TempDir()}
	remote := func(args ...string) result {
		t.Helper()
		return run(t, append([]string{"VMSUP_ROOT=/nonexistent", "VMSUP_SYSTEMD_BUS=unix:path=/nonexistent"}, client...), args...)
	}
	for name, b := range map[string]string{"h1": op, "h1view": view} {
		if r := remote("remote", "add", name, "--bundle", b); r.code != 0 || !strings.Contains(r.stdout, url) {
			t.Fatalf("remote add %s: %+v", name, r)
		}
	}
	web := filepath.Join(dir, "web-e.toml")
	if err := os.WriteFile(web, []byte(guestTOML("web-e")), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := remote("--remote", "h1", "up", web); r.code != 0 {
		t.Fatalf("--remote h1 up: %+v", r)
	}
	defer local("kill", "web-e")
	if r := remote("--remote", "h1", "ls"); r.code != 0 || !strings.Contains(r.stdout, "web-e") || strings.Contains(r.stdout, "api") {
		t.Errorf("--remote h1 ls: %+v; want web-e and no api", r)
	}
	cmd, in, out := startCLI(t, ctx, client, "--remote", "h1", "console", "web-e")
	consoleAnswers(t, ctx, cmd, in, out)
	want := `vmsup: vm "web-e": cn:view may not down: it needs role operator, cn:view has read-only for this VM`
	if r := remote("--remote", "h1view", "down", "web-e"); r.code == 0 || strings.TrimSpace(r.stderr) != want {
		t.Errorf("down as read-only: %+v; want %q", r, want)
	}
	if r := remote("--remote", "nosuch", "ls"); r.code != 2 || !strings.Contains(r.stderr, "--remote nosuch: no such remote") {
		t.Errorf("--remote nosuch: %+v", r)
	}
	ownUnitsAlone(t, sd, local, remote)
	refusedNames(t, local, dir)
}

// ownUnitsAlone: with vmsup-api.service running (the last call was under
// its idle_exit ago), status, down and kill api refuse in one line, as for
// no such VM, locally and remotely, and the server runs on, the same
// process; ls lists no VM api.
func ownUnitsAlone(t *testing.T, sd *testenv.Systemd, local, remote func(...string) result) {
	ctx := context.Background()
	pid := func() string {
		out, err := sd.Systemctl(ctx, "show", "-p", "ActiveState", "-p", "MainPID", remoteapi.ServiceUnit)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(out)), " ")
	}
	before := pid()
	if !strings.Contains(before, "ActiveState=active") {
		t.Fatalf("%s: %s; want it running", remoteapi.ServiceUnit, before)
	}
	if r := local("ls"); r.code != 0 || strings.Contains(r.stdout, "api") || !strings.Contains(r.stdout, "web-e") {
		t.Errorf("ls with the API server running: %+v; want web-e and no api", r)
	}
	for _, args := range [][]string{{"status", "api"}, {"down", "api"}, {"kill", "api"}, {"down", "--force", "API"}} {
		for where, r := range map[string]result{"locally": local(args...), "remotely": remote(append([]string{"--remote", "h1"}, args...)...)} {
			if r.code != 3 || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 || !strings.Contains(r.stderr, "is reserved") || strings.Contains(r.stdout, "killed") {
				t.Errorf("%s %s: %+v; want exit 3, one line: reserved", where, strings.Join(args, " "), r)
			}
		}
	}
	if after := pid(); after != before {
		t.Errorf("%s: %s after the refused calls, %s before: it was touched", remoteapi.ServiceUnit, after, before)
	}
}

// refusedNames: validate refuses every reserved name, naming the file and
// the field.
func refusedNames(t *testing.T, local func(...string) result, dir string) {
	var files []string
	for _, n := range append(spec.ReservedNames(), "fleet-guard-x1-2") {
		p := filepath.Join(dir, "own-"+n+".toml")
		if err := os.WriteFile(p, []byte(strings.Replace(guestTOML(n), "[display]\n", "", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	r := local(append([]string{"validate"}, files...)...)
	for i, f := range files {
		n := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "own-"), ".toml")
		if line := fmt.Sprintf("%s:1:1: name: name %q is reserved", f, n); r.code == 0 || !strings.Contains(r.stderr, line) {
			t.Errorf("validate (file %d): want %q in: %+v", i, line, r)
		}
	}
}

// checkInstalled: the units api install wrote run the server with the
// global flags it was given (--root, -v, the environment's), and its keys are 0600.
func checkInstalled(t *testing.T, unitDir, root string) {
	b, err := os.ReadFile(filepath.Join(unitDir, remoteapi.ServiceUnit))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--root=" + root + " ", "--verbose ", "--unit-dir=" + unitDir + " ", " api serve --config " + filepath.Join(root, "remote", "remote.toml")} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q:\n%s", remoteapi.ServiceUnit, want, b)
		}
	}
	for _, k := range []string{"ca-key.pem", "server-key.pem"} {
		if st, err := os.Stat(filepath.Join(root, "remote", "pki", k)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want 0600", k, st, err)
		}
	}
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
