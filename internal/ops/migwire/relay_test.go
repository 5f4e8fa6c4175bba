package migwire

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRelayToken: the destination's relay bridges only connections that
// start with the token; others are closed before anything reaches QEMU's
// socket. Pure Go: a unix echo server stands in for QEMU.
func TestRelayToken(t *testing.T) {
	sock, reached := fakeQEMUSocket(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tok := NewToken()
	r := StartRelay(ln, func() (net.Conn, error) { return net.Dial("unix", sock) }, CheckToken(tok), nil, slog.New(slog.DiscardHandler))
	defer r.Close()

	bad, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	bad.Write([]byte("0123456789abcdef0123456789abcdef0000"))
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := bad.Read(make([]byte, 1)); err == nil {
		t.Fatalf("a connection with a wrong token got %d bytes", n)
	}
	select {
	case <-reached:
		t.Fatal("a connection with a wrong token reached QEMU's socket")
	case <-time.After(100 * time.Millisecond):
	}

	good, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	expectBridged(t, good, tok)
}

// TestRelayTLS: the destination's relay speaks only TLS with the certificate
// it announced: a plaintext connection carrying the right token and a TLS
// client pinning another certificate never reach QEMU's socket; the pinned
// client with the token is bridged.
func TestRelayTLS(t *testing.T) {
	sock, reached := fakeQEMUSocket(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := NewTLS()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewTLS()
	tok := NewToken()
	r := StartRelay(rt.Listen(ln), func() (net.Conn, error) { return net.Dial("unix", sock) }, CheckToken(tok), nil, slog.New(slog.DiscardHandler))
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	plain, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	SendToken(tok)(plain, 0)
	plain.SetReadDeadline(time.Now().Add(5 * time.Second))
	plain.Read(make([]byte, 64)) // the server's TLS alert, or EOF
	plain.Close()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DialTLS(ctx, c, other.Pin); err == nil || !strings.Contains(err.Error(), "not the one it announced") {
		t.Fatalf("TLS with another pin: %v", err)
	}
	select {
	case <-reached:
		t.Fatal("a plaintext or mis-pinned connection reached QEMU's socket")
	case <-time.After(200 * time.Millisecond):
	}

	c, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	good, err := DialTLS(ctx, c, rt.Pin)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	expectBridged(t, good, tok)
}

// fakeQEMUSocket stands in for QEMU's incoming socket: an echo server that
// reports each connection that reaches it.
func fakeQEMUSocket(t *testing.T) (string, <-chan struct{}) {
	sock := filepath.Join(t.TempDir(), "qemu.sock")
	qemu, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qemu.Close() })
	reached := make(chan struct{}, 4)
	go func() {
		for {
			c, err := qemu.Accept()
			if err != nil {
				return
			}
			reached <- struct{}{}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return sock, reached
}

// expectBridged sends the token on c and checks that what follows comes back
// from the fake QEMU's echo.
func expectBridged(t *testing.T, c net.Conn, tok string) {
	t.Helper()
	if err := SendToken(tok)(c, 0); err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("stream"))
	buf := make([]byte, 6)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "stream" {
		t.Fatalf("bridged echo: %q %v", buf, err)
	}
}
