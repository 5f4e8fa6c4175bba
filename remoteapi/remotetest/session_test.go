package remotetest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/remoteapi/client"
)

// checkSessions: the serial console and the VNC server of running VM vm
// (whose file has a [display]) through the API's websockets: the remote
// CLI's console runs a command in the guest's shell and shows its output,
// a raw websocket and the remote CLI's vnc both get the RFB greeting, an
// open session keeps the server up, and a read-only client is refused
// both (audited).
func (h *host) checkSessions(t *testing.T, vm string) {
	t.Helper()
	want := `vmsup: vm "` + vm + `": cn:viewer may not console: it needs role operator, cn:viewer has read-only for this VM`
	if r := h.remote(t, "viewer", "console", vm); r.code != 1 || strings.TrimSpace(r.stderr) != want {
		t.Errorf("console as read-only: %+v, want exit 1 and %q", r, want)
	}
	if r := h.remote(t, "viewer", "vnc", vm); r.code != 1 || !strings.Contains(r.stderr, "cn:viewer may not vnc-ticket: it needs role operator") {
		t.Errorf("vnc as read-only: %+v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, resp, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(h.url, "https")+"/v1/vms/"+vm+"/vnc",
		&websocket.DialOptions{HTTPClient: h.httpClient(t, "viewer")}); err == nil || resp == nil || resp.StatusCode != 403 {
		t.Errorf("a VNC websocket as read-only: %v, want 403", err)
	}
	refused := map[string]bool{}
	for _, e := range auditEntries(t, filepath.Join(h.root, "remote", "api-security.log")) {
		if e["identity"] == "cn:viewer" && e["verdict"] == "refused" {
			refused[e["call"].(string)] = true
		}
	}
	for _, call := range []string{"GET /v1/vms/{name}/console", "GET /v1/vms/{name}/vnc", "POST /v1/vms/{name}/vnc-ticket"} {
		if !refused[call] {
			t.Errorf("the read-only client's %s is not in api-security.log: %v", call, refused)
		}
	}

	// VNC: a raw websocket, then the remote CLI's local port.
	ws, _, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(h.url, "https")+"/v1/vms/"+vm+"/vnc",
		&websocket.DialOptions{HTTPClient: h.httpClient(t, "operator")})
	if err != nil {
		t.Fatalf("VNC websocket: %v", err)
	}
	rfbGreeting(t, "the VNC websocket", websocket.NetConn(ctx, ws, websocket.MessageBinary))
	h.remoteVNC(t, ctx, vm)
	h.remoteConsole(t, ctx, vm)
	h.remoteConsoleTTY(t, ctx, vm)
	h.sessionKeepsServer(t, ctx, vm)
}

// rfbGreeting reads a VNC server's first line from c and closes c.
func rfbGreeting(t *testing.T, what string, c net.Conn) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	hello := make([]byte, 12)
	if _, err := io.ReadFull(c, hello); err != nil || !strings.HasPrefix(string(hello), "RFB 003.00") {
		t.Errorf("%s: greeting %q, %v", what, hello, err)
		return
	}
	t.Logf("%s: %q", what, hello)
}

// startRemote starts the remote CLI as who with its stdin a pipe.
func (h *host) startRemote(t *testing.T, ctx context.Context, who string, args ...string) (*exec.Cmd, io.WriteCloser, outFile) {
	t.Helper()
	return startCLI(t, ctx, nil, append(h.remoteArgs(who), args...)...)
}

// startCLI starts the CLI, with no host environment and extra, its stdin a
// pipe.
func startCLI(t *testing.T, ctx context.Context, extra []string, args ...string) (*exec.Cmd, io.WriteCloser, outFile) {
	t.Helper()
	cmd := exec.CommandContext(ctx, vmsupBin, args...)
	cmd.Env = append(append(os.Environ(), "VMSUP_ROOT=/nonexistent", "VMSUP_SYSTEMD_BUS=unix:path=/nonexistent"), extra...)
	f, err := os.CreateTemp(t.TempDir(), "session-")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() // ours, by pid
			cmd.Wait()
		}
	})
	return cmd, in, outFile{f}
}

// remoteVNC: vmsup --remote vnc listens on this side and hands the VNC
// client that comes the VM's screen through the API.
func (h *host) remoteVNC(t *testing.T, ctx context.Context, vm string) {
	cmd, in, out := h.startRemote(t, ctx, "operator", "vnc", vm)
	defer in.Close()
	var line string
	for line == "" || !strings.Contains(line, "\n") {
		if ctx.Err() != nil {
			t.Fatalf("vnc --remote printed %q", out.String())
		}
		time.Sleep(50 * time.Millisecond)
		line = out.String()
	}
	addr, ok := strings.CutPrefix(strings.SplitN(line, "\n", 2)[0], "vnc://")
	if !ok {
		t.Fatalf("vnc --remote printed %q, want vnc://ADDR", line)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	rfbGreeting(t, "vmsup --remote vnc's port", c)
	if err := cmd.Wait(); err != nil {
		t.Errorf("vnc --remote after the client left: %v: %s", err, out.String())
	}
}

// remoteConsole: vmsup --remote console sends what it reads to the guest's
// serial console and prints what the guest prints: the shell runs a
// command and its output comes back.
func (h *host) remoteConsole(t *testing.T, ctx context.Context, vm string) {
	cmd, in, out := h.startRemote(t, ctx, "operator", "console", vm)
	consoleAnswers(t, ctx, cmd, in, out)
}

// consoleAnswers: the guest's shell behind a console CLI (cmd) runs a
// command and its output comes back; the CLI ends with its stdin.
func consoleAnswers(t *testing.T, ctx context.Context, cmd *exec.Cmd, in io.WriteCloser, out outFile) {
	start := time.Now()
	for !strings.Contains(out.String(), "remote-42") {
		if ctx.Err() != nil {
			t.Fatalf("console --remote: no remote-42 from the guest; it printed %q", out.String())
		}
		if _, err := io.WriteString(in, "echo remote-$((6*7))\n"); err != nil {
			t.Fatalf("console --remote: stdin: %v (%s)", err, out.String())
		}
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && !strings.Contains(out.String(), "remote-42"); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("console --remote: the guest's shell answered in %v", time.Since(start).Round(time.Millisecond))
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("console --remote after its stdin ended: %v: %s", err, out.String())
	}
}

// remoteConsoleTTY: on a terminal, vmsup --remote console is the local
// one: raw mode, the guest's shell answers, Ctrl-] detaches.
func (h *host) remoteConsoleTTY(t *testing.T, ctx context.Context, vm string) {
	master, tty := openPTY(t)
	cmd := exec.CommandContext(ctx, vmsupBin, append(h.remoteArgs("operator"), "console", vm)...)
	cmd.Env = append(os.Environ(), "VMSUP_ROOT=/nonexistent", "VMSUP_SYSTEMD_BUS=unix:path=/nonexistent")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	var mu sync.Mutex
	var screen strings.Builder
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			mu.Lock()
			screen.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	shown := func(s string) bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(screen.String(), s)
	}
	for !shown("tty-42") {
		if ctx.Err() != nil {
			t.Fatalf("console --remote on a terminal: no tty-42; the screen: %q", screen.String())
		}
		master.Write([]byte("echo tty-$((6*7))\r"))
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && !shown("tty-42"); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	master.Write([]byte{0x1d}) // Ctrl-]
	err := cmd.Wait()
	t.Logf("console --remote on a terminal: Ctrl-] detached it (%v)", err)
	if err != nil || !shown("Connected to the console; Ctrl-] detaches.") || !shown("Detached.") {
		t.Errorf("console --remote on a terminal after Ctrl-]: %v; the screen: %q", err, screen.String())
	}
}

// openPTY opens a pseudo-terminal: its master and its terminal.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// sessionKeepsServer: an open console is a call in flight: the server
// stays up past idle_exit while it is open, and exits after it closes.
func (h *host) sessionKeepsServer(t *testing.T, ctx context.Context, vm string) {
	c, err := client.New(client.Options{URL: h.url, CA: h.pki.CAFile, Cert: h.certs["operator"][0], Key: h.certs["operator"][1]})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := c.DialConsole(ctx, vm)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(idleExit + 2*time.Second)
	if !serverRuns() {
		t.Errorf("no vmsup api serve with a console open %s after it opened (idle_exit %s)", idleExit+2*time.Second, idleExit)
	}
	conn.Close()
	t.Logf("server gone %s after the console closed", waitNoServer(t))
}

// serverRuns reports whether a vmsup api serve runs.
func serverRuns() bool {
	for _, p := range vmsupProcs() {
		if strings.Contains(p, " api serve") {
			return true
		}
	}
	return false
}
