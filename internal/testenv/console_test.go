package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
		"-append", "console=ttyS0", "-chardev", "socket,id=c,path="+sock+",server=on,wait=off,logfile="+log,
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
