package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGuestBoot boots the guest under plain QEMU (TCG), waits for its console markers,
// types a command on the serial shell, pings qemu-ga, then powers it off over raw QMP.
func TestGuestBoot(t *testing.T) {
	SkipUnlessRoot(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	g, err := Guest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Guest (cached) returned in %v: %+v", time.Since(t0), g)

	dir := t.TempDir()
	qmpSock, qgaSock := filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "qga.sock")
	cmd := exec.Command(qemu, "-accel", "tcg", "-cpu", "max", "-machine", "q35", "-m", "256",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-kernel", g.Kernel, "-initrd", g.Initrd, "-append", "console=ttyS0 no_timer_check quiet",
		"-serial", "stdio",
		"-qmp", "unix:"+qmpSock+",server=on,wait=off",
		"-device", "virtio-serial",
		"-chardev", "socket,path="+qgaSock+",server=on,wait=off,id=qga0",
		"-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	}()

	con := newConsole(stdout)
	waitLine := func(what string, timeout time.Duration) {
		t.Helper()
		if err := con.waitFor(what, timeout); err != nil {
			t.Fatalf("%v\nconsole:\n%s\nstderr: %s", err, con.text(), stderr.String())
		}
	}
	waitLine(ReadyMarker, 90*time.Second)
	t.Logf("boot to %s: %v", ReadyMarker, time.Since(start))
	waitLine(ShellMarker, 10*time.Second)
	fmt.Fprintf(stdin, "echo shell-$((6*7))\n")
	waitLine("shell-42", 10*time.Second)

	// qemu-ga answers on its virtio port (started in the background by /init).
	if err := pingGuestAgent(qgaSock, 30*time.Second); err != nil {
		t.Fatalf("guest agent: %v", err)
	}
	t.Logf("qemu-ga answered %v after start", time.Since(start))

	q, err := dialQMP(qmpSock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	t1 := time.Now()
	if _, err := q.execute("system_powerdown"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the deferred clean-up
		if err != nil {
			t.Fatalf("QEMU exited with %v\nstderr: %s", err, stderr.String())
		}
		t.Logf("system_powerdown to QEMU exit: %v", time.Since(t1))
	case <-time.After(10 * time.Second):
		t.Fatalf("QEMU still running 10 s after system_powerdown\nconsole:\n%s", con.text())
	}
}

// console collects the guest's serial output line by line.
type console struct {
	lines chan string
	all   strings.Builder
}

func newConsole(r io.Reader) *console {
	c := &console{lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.lines <- strings.TrimRight(sc.Text(), "\r")
		}
		close(c.lines)
	}()
	return c
}

// waitFor reads lines until one contains s. Only the test goroutine calls it.
func (c *console) waitFor(s string, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return fmt.Errorf("console closed before %q", s)
			}
			c.all.WriteString(l + "\n")
			if strings.Contains(l, s) {
				return nil
			}
		case <-deadline:
			return fmt.Errorf("no %q on the console in %v", s, timeout)
		}
	}
}

func (c *console) text() string { return c.all.String() }

// qmpConn is a bare QMP client: JSON lines, no package of this repository.
type qmpConn struct {
	net.Conn
	r *bufio.Reader
}

func dialQMP(path string) (*qmpConn, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	q := &qmpConn{Conn: c, r: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := q.r.ReadBytes('\n'); err != nil { // greeting
		c.Close()
		return nil, err
	}
	if _, err := q.execute("qmp_capabilities"); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

// execute sends a command and returns its "return" value, skipping events.
func (q *qmpConn) execute(cmd string) (json.RawMessage, error) {
	if _, err := fmt.Fprintf(q, `{"execute":%q}`+"\n", cmd); err != nil {
		return nil, err
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct{ Class, Desc string }
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
		}
		if resp.Return != nil {
			return resp.Return, nil
		}
	}
}

// pingGuestAgent syncs with qemu-ga (guest-sync-delimited, re-sent until the agent is
// up) and sends guest-ping.
func pingGuestAgent(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c, err := net.Dial("unix", path)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	synced := false
	for id := 1; !synced; id++ {
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to guest-sync-delimited in %v", timeout)
		}
		fmt.Fprintf(c, `{"execute":"guest-sync-delimited","arguments":{"id":%d}}`+"\n", id)
		// Read until this id's answer; answers to earlier syncs are skipped, and a
		// second without one means the agent is not up yet: sync again.
		for !synced {
			c.SetReadDeadline(time.Now().Add(time.Second))
			line, err := r.ReadBytes('\n')
			if err != nil {
				break
			}
			var resp struct{ Return int }
			synced = json.Unmarshal(bytes.TrimLeft(line, "\xff"), &resp) == nil && resp.Return == id
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, `{"execute":"guest-ping"}`+"\n")
	line, err := r.ReadBytes('\n')
	if err != nil {
		return err
	}
	if !bytes.Contains(line, []byte(`"return"`)) {
		return fmt.Errorf("guest-ping: %s", line)
	}
	return nil
}
