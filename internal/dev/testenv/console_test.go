package testenv

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestGuestShell(t *testing.T) {
	SkipUnlessRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g, err := Guest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vmsup-con")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock, log := filepath.Join(dir, "c.sock"), filepath.Join(dir, "c.log")
	q := exec.Command("qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-machine", "q35", "-m", "256",
		"-nodefaults", "-no-user-config", "-display", "none", "-kernel", g.Kernel, "-initrd", g.Initrd,
		"-append", "console=ttyS0 no_timer_check", "-chardev", "socket,id=c,path="+sock+",server=on,wait=off,logfile="+log,
		"-serial", "chardev:c")
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { q.Process.Kill(); q.Wait() }()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if b, _ := os.ReadFile(log); strings.Contains(string(b), ShellMarker) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no shell marker")
		}
	}
	sh, err := DialConsole(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	out, code, err := sh.Run(ctx, "echo $((6*7)); echo to-stderr >&2")
	if err != nil || code != 0 || out != "42\nto-stderr" {
		t.Fatalf("Run = %q, %d, %v", out, code, err)
	}
	if _, code, err := sh.Run(ctx, "false"); err != nil || code != 1 {
		t.Fatalf("false: %d %v", code, err)
	}
	out, _, err = sh.Run(ctx, "seq 1 2000 | tail -1")
	if err != nil || out != "2000" {
		t.Fatalf("seq: %q %v", out, err)
	}
}

// TestGuestShellKernelNoise: a kernel message printed right after the start
// tag, on its line (a device probed while the command runs), does not hide
// the answer. A fake console stands in for the guest.
func TestGuestShellKernelNoise(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		m := regexp.MustCompile(`printf '%s%s\\n' '(\S+)' '(\S+)S'`).FindStringSubmatch(line)
		if m == nil {
			return
		}
		tag := m[1] + m[2]
		c.Write([]byte(line + tag + "S[    4.994799] virtio-pci 0000:02:00.0: enabling device\r\nhello\r\n\r\n" + tag + "E 0\r\nvmsup-guest# "))
		time.Sleep(time.Second)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sh, err := DialConsole(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if out, code, err := sh.Run(ctx, "echo hello"); err != nil || code != 0 || out != "hello" {
		t.Fatalf("Run = %q, %d, %v", out, code, err)
	}
}
