package remotetest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRemoteCLI: the remote CLI drives a VM on a host in another network
// namespace end to end (up, status, ls, exec, events -f, events --since,
// logs, snapshot create/ls, pause/resume, down) with the output the CLI on
// the host gives, and no vmsup process lives on the host between calls;
// console and VNC sessions through websockets (checkSessions); backup and
// migrate --local (backupAndMigrate).
func TestRemoteCLI(t *testing.T) {
	h := startHost(t)
	if p := vmsupProcs(); len(p) > 0 {
		t.Fatalf("vmsup processes before the first call: %v", p)
	}
	ra, la := h.writeVM(t, "ra", guestTOML("ra")+h.dataDisk(t, "ra")), h.writeVM(t, "la", guestTOML("la")+h.dataDisk(t, "la"))
	// up: the remote one on ra, the local one on la, alike.
	rUp := h.remote(t, "admin", "up", ra)
	lUp := h.local(t, "up", la)
	defer h.local(t, "kill", "ra", "la")
	same(t, "up", rUp, lUp, "ra", "la")
	t.Logf("server gone %s after up", waitNoServer(t))

	// exec, status and ls once the guest agent answers (2-3 s after start
	// under TCG).
	deadline := time.Now().Add(90 * time.Second)
	for _, vm := range []string{"ra", "la"} { // ls shows both
		for h.local(t, "exec", vm, "--", "true").code != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s's guest agent did not answer", vm)
			}
			time.Sleep(time.Second)
		}
	}
	for _, args := range [][]string{{"exec", "ra", "--", "uname", "-s"}, {"exec", "ra", "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 3"}} {
		same(t, strings.Join(args, " "), h.remote(t, "admin", args...), h.local(t, args...), "", "")
	}
	// status and ls once the agent answers: before, one of the two runs
	// could find it answering and the other not.
	for _, args := range [][]string{{"status", "ra"}, {"status", "--json", "ra"}, {"ls"}, {"ls", "--json"}} {
		same(t, strings.Join(args, " "), h.remote(t, "admin", args...), h.local(t, args...), "", "")
	}
	h.checkSessions(t, "ra")
	h.followEvents(t)
	h.checkSchema(t, "ra")
	for _, args := range [][]string{{"events", "--since", "1h", "ra"}, {"events", "--json", "ra"}, {"logs", "ra"}} {
		same(t, strings.Join(args, " "), h.remote(t, "admin", args...), h.local(t, args...), "", "")
	}
	same(t, "snapshot create", h.remote(t, "admin", "snapshot", "create", "ra", "s1"), h.local(t, "snapshot", "create", "la", "s1"), "ra", "la")
	for _, args := range [][]string{{"snapshot", "ls", "ra"}, {"snapshot", "ls", "--json", "ra"}} {
		same(t, strings.Join(args, " "), h.remote(t, "admin", args...), h.local(t, args...), "", "")
	}
	h.backupAndMigrate(t)
	same(t, "down", h.remote(t, "admin", "down", "ra"), h.local(t, "down", "la"), "ra", "la")
	same(t, "status of a VM that is down", h.remote(t, "admin", "status", "ra"), h.local(t, "status", "ra"), "", "")
	same(t, "no such VM", h.remote(t, "admin", "status", "nosuch"), h.local(t, "status", "nosuch"), "", "")
	t.Logf("server gone %s after the last call", waitNoServer(t))
}

// same fails unless the remote and the local run printed the same (VM from
// named to in the remote output) and exited alike.
func same(t *testing.T, what string, r, l result, from, to string) {
	t.Helper()
	if r.code != l.code {
		t.Errorf("%s: remote exit %d (%s), local %d (%s)", what, r.code, r.stderr, l.code, l.stderr)
	}
	if d := cmp.Diff(norm(l.stdout, "", ""), norm(r.stdout, from, to)); d != "" {
		t.Errorf("%s: remote and local stdout differ (-local +remote):\n%s", what, d)
	}
	if d := cmp.Diff(norm(l.stderr, "", ""), norm(r.stderr, from, to)); d != "" {
		t.Errorf("%s: remote and local stderr differ (-local +remote):\n%s", what, d)
	}
}

// followEvents runs events -f remotely and locally while the VM is paused
// and resumed remotely: both show the same lines.
func (h *host) followEvents(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := func(extra []string, args ...string) (*exec.Cmd, outFile) {
		cmd := exec.CommandContext(ctx, vmsupBin, args...)
		cmd.Env = append(os.Environ(), extra...)
		f, err := os.CreateTemp(t.TempDir(), "events-")
		if err != nil {
			t.Fatal(err)
		}
		out := outFile{f}
		cmd.Stdout = f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, out
	}
	rc, rout := start(nil, append(h.remoteArgs("viewer"), "events", "-f", "--since", "1h", "ra")...)
	lc, lout := start(h.localEnv(), "events", "-f", "--since", "1h", "ra")
	stop := func() {
		for _, c := range []*exec.Cmd{rc, lc} {
			c.Process.Kill() // ours, by pid
			c.Wait()
		}
	}
	defer stop()
	for _, args := range [][]string{{"pause", "ra"}, {"resume", "ra"}} {
		if r := h.remote(t, "operator", args...); r.code != 0 {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	// A RESUME after the pause's STOP: the history has the RESUME of the
	// start (QEMU starts paused until vmsup hands it its disks).
	resumed := func(out string) bool {
		i := strings.LastIndex(out, " STOP")
		return i >= 0 && strings.Contains(out[i:], " RESUME")
	}
	for !resumed(rout.String()) || !resumed(lout.String()) {
		if ctx.Err() != nil {
			t.Fatalf("events -f: no RESUME: remote %q local %q", rout.String(), lout.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	if d := cmp.Diff(lout.String(), rout.String()); d != "" {
		t.Errorf("events -f: remote and local differ (-local +remote):\n%s", d)
	}
}

// outFile is a file a background command writes to; String reads it.
type outFile struct{ *os.File }

func (f outFile) String() string {
	b, _ := os.ReadFile(f.Name())
	return string(b)
}

// TestRemoteRefusals: a read-only client is refused a write with a clear
// error and the refusal is audited; a client without a valid certificate
// gets nothing (not even a TLS session), and nothing is audited for it; a
// submitted file naming a host file outside the host's places is refused
// by the same check as a local one; the unix socket knows its caller.
func TestRemoteRefusals(t *testing.T) {
	h := startHost(t)
	vm := h.writeVM(t, "rb", guestTOML("rb"))
	r := h.remote(t, "viewer", "up", vm)
	want := `vmsup: vm "rb": cn:viewer may not up: it needs role operator, cn:viewer has read-only for this VM`
	if r.code != 1 || strings.TrimSpace(r.stderr) != want || r.stdout != "" {
		t.Errorf("read-only up: %+v, want exit 1 and %q", r, want)
	}
	r = h.remote(t, "operator", "--json", "up", h.writeVM(t, "xb", guestTOML("xb")))
	if r.code != 1 || !strings.Contains(r.stdout, `"kind": "forbidden"`) || !strings.Contains(r.stdout, "cn:operator has no role") {
		t.Errorf("operator outside its VMs, --json: %+v", r)
	}
	entries := auditEntries(t, filepath.Join(h.root, "remote", "api-security.log"))
	if len(entries) != 2 || entries[0]["identity"] != "cn:viewer" || entries[0]["verdict"] != "refused" ||
		entries[0]["call"] != "POST /v1/up" || !strings.Contains(entries[0]["reason"].(string), "needs role operator") {
		t.Errorf("security audit: %v", entries)
	}
	before := len(auditEntries(t, filepath.Join(h.root, "remote", "api.log")))

	// The right name from the wrong CA, and no certificate at all.
	rogue := run(t, nil, "--remote", h.url, "--ca", h.pki.CAFile, "--cert", h.rogueCert, "--key", h.rogueKey, "ls")
	if rogue.code != 1 || rogue.stdout != "" || !strings.Contains(rogue.stderr, "tls") {
		t.Errorf("rogue client: %+v", rogue)
	}
	conn, err := tls.Dial("tcp", net.JoinHostPort(h.addr, "8443"), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err == nil {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write([]byte("GET /v1/vms HTTP/1.1\r\nHost: x\r\n\r\n"))
		b, rerr := io.ReadAll(conn)
		conn.Close()
		if len(b) > 0 || rerr == nil {
			t.Errorf("a client without a certificate read %q (%v)", b, rerr)
		}
	}
	if after := len(auditEntries(t, filepath.Join(h.root, "remote", "api.log"))); after != before {
		t.Errorf("calls without a valid certificate were audited: %d entries, %d before", after, before)
	}

	// A file naming /etc/shadow: the host-path check refuses it, as a
	// local up of it.
	evil := h.writeVM(t, "rc", strings.Replace(guestTOML("rc"), `initrd = "`+env.Guest.Initrd+`"`, `initrd = "/etc/shadow"`, 1))
	r = h.remote(t, "admin", "up", evil)
	if r.code == 0 || !strings.Contains(r.stderr, "boot.initrd: /etc/shadow is outside the places VM files may name") {
		t.Errorf("remote up naming /etc/shadow: %+v", r)
	}
	// Allowed by the role, refused by the host's places: audited refused,
	// and in the security log.
	calls := auditEntries(t, filepath.Join(h.root, "remote", "api.log"))
	if last := calls[len(calls)-1]; last["verdict"] != "refused" || !strings.Contains(fmt.Sprint(last["reason"]), "/etc/shadow") {
		t.Errorf("api.log's last entry after the /etc/shadow up: %v", last)
	}
	sec := auditEntries(t, filepath.Join(h.root, "remote", "api-security.log"))
	if last := sec[len(sec)-1]; last["identity"] != "cn:admin" || last["verdict"] != "refused" || last["call"] != "POST /v1/up" ||
		fmt.Sprint(last["vms"]) != "[rc]" || !strings.Contains(fmt.Sprint(last["reason"]), "boot.initrd: /etc/shadow is outside") {
		t.Errorf("api-security.log's last entry after the /etc/shadow up: %v", last)
	}
	// The unix socket: root is uid:0, granted read-only.
	r = run(t, nil, "--remote", "unix://"+h.sock, "ls")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "NAME") {
		t.Errorf("ls over the unix socket: %+v", r)
	}
	r = run(t, nil, "--remote", "unix://"+h.sock, "down", "rb")
	if r.code != 1 || !strings.Contains(r.stderr, "uid:0 may not down") {
		t.Errorf("down over the unix socket as read-only uid:0: %+v", r)
	}
	waitNoServer(t)
}

// TestRemoteIdleConnections: 200 connections that say nothing (or stop
// mid-handshake) do not keep a real client from being served, nor the
// server from exiting once they are dropped.
func TestRemoteIdleConnections(t *testing.T) {
	h := startHost(t)
	addr := net.JoinHostPort(h.addr, "8443")
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := range 200 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		if i%2 == 1 {
			c.Write([]byte{0x16, 0x03, 0x01}) // the start of a ClientHello, never finished
		}
		idle = append(idle, c)
	}
	start := time.Now()
	r := h.remote(t, "viewer", "ls")
	took := time.Since(start)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "NAME") {
		t.Fatalf("ls beside 200 idle connections: %+v", r)
	}
	if took > 5*time.Second {
		t.Errorf("ls beside 200 idle connections took %s", took)
	}
	t.Logf("ls beside 200 idle connections: %s", took)
	// The server drops them (handshake deadline) and exits though they
	// are still open on this side.
	start = time.Now()
	waitNoServer(t)
	t.Logf("server gone %s after the call, the 200 connections still open here", time.Since(start))
}

// auditEntries reads an audit log's entries.
func auditEntries(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, e)
	}
	return out
}
