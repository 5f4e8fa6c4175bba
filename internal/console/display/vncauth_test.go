package display

import (
	"context"
	"crypto/des"
	"encoding/binary"
	"io"
	"math/bits"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vmsup/vmsup/qmp"
)

// TestTicketInQEMU: a VNC server started with password=on lets nobody in
// until a ticket, lets its password in, and nobody once it expired.
func TestTicketInQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("starts QEMU; skipped with -short")
	}
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
	}
	dir := t.TempDir()
	vnc, mon := filepath.Join(dir, "vnc.sock"), filepath.Join(dir, "qmp.sock")
	cmd := exec.Command(bin, "-nodefaults", "-no-user-config", "-display", "none", "-S", "-accel", "tcg",
		"-device", "VGA", "-vnc", "unix:"+vnc+",password=on", "-qmp", "unix:"+mon+",server=on,wait=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }() // ours, by its pid
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c *qmp.Conn
	for c == nil {
		if c, err = qmp.Dial(ctx, mon); err != nil {
			if ctx.Err() != nil {
				t.Fatalf("QMP: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	defer c.Close()

	if vncLogin(t, vnc, "") {
		t.Errorf("logged in before any ticket")
	}
	pw, err := Ticket(ctx, c, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !vncLogin(t, vnc, pw) {
		t.Errorf("the ticket's password %q did not log in", pw)
	}
	if vncLogin(t, vnc, "wrong") {
		t.Errorf("a wrong password logged in")
	}
	if info, err := c.QueryVNC(ctx); err != nil || info.Auth != "vnc" || info.Family != "unix" {
		t.Errorf("query-vnc: %+v, %v", info, err)
	}
	if err := c.ExpireVNCPassword(ctx, "now"); err != nil {
		t.Fatal(err)
	}
	if vncLogin(t, vnc, pw) {
		t.Errorf("the expired ticket still logs in")
	}
}

// vncLogin does RFB 3.8's VNC authentication on sock with password and
// reports whether the server accepted it.
func vncLogin(t *testing.T, sock, password string) bool {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("RFB: %v", err)
		}
	}
	version := make([]byte, 12)
	_, err = io.ReadFull(conn, version)
	must(err)
	_, err = conn.Write([]byte("RFB 003.008\n"))
	must(err)
	n := make([]byte, 1)
	_, err = io.ReadFull(conn, n)
	must(err)
	types := make([]byte, n[0])
	_, err = io.ReadFull(conn, types)
	must(err)
	if !slices.Contains(types, 2) {
		t.Fatalf("RFB security types %v lack VNC authentication (2)", types)
	}
	_, err = conn.Write([]byte{2})
	must(err)
	challenge := make([]byte, 16)
	_, err = io.ReadFull(conn, challenge)
	must(err)
	key := make([]byte, 8)
	copy(key, password)
	for i := range key {
		key[i] = bits.Reverse8(key[i]) // VNC's DES key bit order
	}
	block, err := des.NewCipher(key)
	must(err)
	resp := make([]byte, 16)
	block.Encrypt(resp[:8], challenge[:8])
	block.Encrypt(resp[8:], challenge[8:])
	_, err = conn.Write(resp)
	must(err)
	result := make([]byte, 4)
	if _, err := io.ReadFull(conn, result); err != nil {
		return false
	}
	return binary.BigEndian.Uint32(result) == 0
}
