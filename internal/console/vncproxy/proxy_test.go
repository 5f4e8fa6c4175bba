package vncproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/vmsup/vmsup/internal/console/vncproxy/vncproxytest"
)

// fakeVNC dials a stand-in VNC server that greets and echoes.
func fakeVNC(t *testing.T) Dialer {
	sock := vncproxytest.Socket(t)
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
}

func loopback(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// refused reports whether nothing listens on addr any more.
func refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err != nil
}

func TestServeOne(t *testing.T) {
	ln := loopback(t)
	addr := ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- ServeOne(context.Background(), ln, 10*time.Second, fakeVNC(t)) }()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, 12)
	if _, err := io.ReadFull(c, hello); err != nil || string(hello) != "RFB 003.008\n" {
		t.Fatalf("greeting %q, %v", hello, err)
	}
	c.Write([]byte("ping"))
	back := make([]byte, 4)
	if _, err := io.ReadFull(c, back); err != nil || string(back) != "ping" {
		t.Fatalf("echo %q, %v", back, err)
	}
	if !refused(addr) {
		t.Errorf("a second client could connect during the session")
	}
	c.Close()
	ended(t, done, "ServeOne")
}

// ended waits for a session's end and wants no error.
func ended(t *testing.T, done chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still runs after the session ended", what)
	}
}

func TestServeOneNoClient(t *testing.T) {
	ln := loopback(t)
	err := ServeOne(context.Background(), ln, 100*time.Millisecond, fakeVNC(t))
	if !errors.Is(err, ErrNoClient) || !refused(ln.Addr().String()) {
		t.Errorf("ServeOne with no client: %v; listener closed: %v", err, refused(ln.Addr().String()))
	}
}

// webServer starts Serve on a page directory of its own.
func webServer(t *testing.T, wait time.Duration) (*Web, string, chan error) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vnc.html"), []byte("<title>noVNC</title>"), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	w := &Web{Dir: dir, Token: tok, Wait: wait, Dial: fakeVNC(t)}
	ln := loopback(t)
	done := make(chan error, 1)
	go func() { done <- w.Serve(context.Background(), ln) }()
	return w, ln.Addr().String(), done
}

func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestWebToken(t *testing.T) {
	w, addr, done := webServer(t, 10*time.Second)
	u := w.URL(addr)
	if !strings.Contains(u, "/"+w.Token+"/vnc.html?") || !strings.Contains(u, "path="+w.Token+"%2Fwebsockify") {
		t.Errorf("URL %s", u)
	}
	if code, body := status(t, u); code != 200 || !strings.Contains(body, "noVNC") {
		t.Errorf("the page with the token: %d %q", code, body)
	}
	wrong := "http://" + addr + "/" + strings.Repeat("x", len(w.Token))
	for _, p := range []string{wrong + "/vnc.html", "http://" + addr + "/vnc.html", "http://" + addr + "/"} {
		if code, body := status(t, p); code != 404 || strings.Contains(body, "noVNC") {
			t.Errorf("GET %s: %d %q, want a bare 404", p, code, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(wrong, "http")+"/websockify", nil); err == nil || resp.StatusCode != 404 {
		t.Errorf("websocket with a wrong token: %v", err)
	}
	ws := "ws://" + addr + "/" + w.Token + "/websockify"
	c, _, err := websocket.Dial(ctx, ws, nil)
	if err != nil {
		t.Fatalf("websocket with the token: %v", err)
	}
	nc := websocket.NetConn(ctx, c, websocket.MessageBinary)
	hello := make([]byte, 12)
	if _, err := io.ReadFull(nc, hello); err != nil || string(hello) != "RFB 003.008\n" {
		t.Fatalf("greeting through the websocket %q, %v", hello, err)
	}
	if !refused(addr) {
		t.Errorf("the listener stays open during the session")
	}
	nc.Close()
	ended(t, done, "Serve")
}

func TestWebExpires(t *testing.T) {
	w, addr, done := webServer(t, 200*time.Millisecond)
	if err := <-done; !errors.Is(err, ErrNoClient) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("Serve with no browser: %v", err)
	}
	if !refused(addr) {
		t.Errorf("something still listens on %s after the token expired (%s)", addr, w.URL(addr))
	}
}
