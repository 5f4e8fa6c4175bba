package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// GuestShell runs shell commands on a test guest's serial console (the
// console socket of a VM whose guest printed ShellMarker).
type GuestShell struct {
	conn net.Conn
	buf  bytes.Buffer
	n    int
}

// DialConsole connects to the console socket at path.
func DialConsole(ctx context.Context, path string) (*GuestShell, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("testenv: console %s: %w", path, err)
	}
	return &GuestShell{conn: c}, nil
}

// Close disconnects; the guest's shell keeps running.
func (g *GuestShell) Close() error { return g.conn.Close() }

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// Run runs cmd in the guest's shell and returns its output (stdout and
// stderr, without the echoed command line) and exit status. It marks the
// end of the output with a unique line, so it never mistakes old console
// output for the answer.
func (g *GuestShell) Run(ctx context.Context, cmd string) (string, int, error) {
	g.n++
	tag := fmt.Sprintf("__VMSUP_END_%d_%d__", os.Getpid(), g.n)
	// The start and end tags are joined by the shell's printf from two
	// halves, so the echoed (possibly wrapped) command line never holds them.
	half := len(tag) / 2
	line := fmt.Sprintf("printf '%%s%%s\\n' '%s' '%sS'; %s; printf '\\n%%s%%s %%d\\n' '%s' '%sE' $?\n",
		tag[:half], tag[half:], cmd, tag[:half], tag[half:])
	if _, err := g.conn.Write([]byte(line)); err != nil {
		return "", 0, err
	}
	// Kernel messages on the console can land right after the start tag
	// (a hotplugged device being probed): skip the rest of that line.
	re := regexp.MustCompile(`(?s)` + regexp.QuoteMeta(tag+"S") + `[^\n]*\n(.*?)\n?` + regexp.QuoteMeta(tag+"E") + ` (\d+)`)
	buf := make([]byte, 4096)
	start := time.Now()
	for {
		// Bounded even under a long test context: a command that never
		// answers fails in two minutes, not when the whole test times out.
		dl := start.Add(2 * time.Minute)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		_ = g.conn.SetReadDeadline(dl)
		n, err := g.conn.Read(buf)
		g.buf.Write(buf[:n])
		text := ansi.ReplaceAllString(strings.ReplaceAll(g.buf.String(), "\r", ""), "")
		if m := re.FindStringSubmatch(text); m != nil {
			code, _ := strconv.Atoi(m[2])
			g.buf.Reset()
			return strings.TrimSpace(m[1]), code, nil
		}
		if err != nil {
			return text, 0, fmt.Errorf("testenv: console: %q: %w", cmd, err)
		}
	}
}

// WaitLog waits until the file at path (a VM's console log) contains marker,
// and fails t with the file's last 2000 bytes if it does not within d (on a
// quiet host; scaled to the host's load: GuestWait).
func WaitLog(t testing.TB, path, marker string, d time.Duration) {
	t.Helper()
	w := StartGuestWait(fmt.Sprintf("%q in %s", marker, filepath.Base(path)), d)
	for ; !w.Expired(); time.Sleep(50 * time.Millisecond) {
		if b, _ := os.ReadFile(path); strings.Contains(string(b), marker) {
			w.Done()
			return
		}
	}
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	t.Fatalf("%q not in %s: %s; it ends:\n%s", marker, path, w.Explain(), b)
}
