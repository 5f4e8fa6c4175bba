package remoteapi_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/console/vncproxy/vncproxytest"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/remoteapi/client"
	"github.com/vmsup/vmsup/remoteapi/remotetest"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// The limits of docs/remote-api.md against a real server over mutual TLS
// on loopback, with operations faked (no guest): each refusal is the clear
// error a client gets.

// blockingOps answers Status of "quick" at once and blocks Status of any
// other VM until release is closed or the call's deadline.
type blockingOps struct {
	remoteapi.Ops // nil: the tests call nothing else
	entered       chan string
	release       chan struct{}
	vmSock        string // a stand-in VM socket: it greets as VNC and echoes
}

func (o *blockingOps) Names() ([]string, error) { return []string{"quick", "slow"}, nil }

func (o *blockingOps) Status(ctx context.Context, name string) (supervisor.Status, error) {
	if name == "quick" {
		return supervisor.Status{Name: name, State: supervisor.StateRunning}, nil
	}
	o.entered <- name
	select {
	case <-o.release:
		return supervisor.Status{Name: name, State: supervisor.StateRunning}, nil
	case <-ctx.Done():
		return supervisor.Status{}, fmt.Errorf("vm %q: status: %w", name, ctx.Err())
	}
}

// limitsHost is a server on 127.0.0.1 and its clients' certificates.
type limitsHost struct {
	addr, root string
	pki        *remotetest.PKI
	ops        *blockingOps
	served     chan error // Serve's return
	servedAt   chan time.Time
}

// startLimits serves with config lines extra; cn:a and cn:b are admins.
func startLimits(t *testing.T, extra string) *limitsHost {
	t.Helper()
	dir := t.TempDir()
	pki, err := remotetest.NewPKI(dir, "limits")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := pki.Issue("server", net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("ca = %q\ncert = %q\nkey = %q\n%s\n", pki.CAFile, cert, key, extra)
	for _, cn := range []string{"a", "b"} {
		if _, _, err := pki.Issue(cn); err != nil {
			t.Fatal(err)
		}
		conf += fmt.Sprintf("[[grant]]\nidentity = \"cn:%s\"\nrole = \"admin\"\nvms = [\"*\"]\n", cn)
	}
	p := filepath.Join(dir, "remote.toml")
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := remoteapi.LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &limitsHost{addr: l.Addr().String(), root: filepath.Join(dir, "root"), pki: pki,
		ops: &blockingOps{entered: make(chan string, 16), release: make(chan struct{}), vmSock: vncproxytest.Socket(t)}, served: make(chan error, 1), servedAt: make(chan time.Time, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	srv := &remoteapi.Server{Ops: h.ops, Config: c, Root: h.root}
	go func() {
		err := srv.Serve(ctx, []net.Listener{l})
		h.servedAt <- time.Now()
		h.served <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.served:
		case <-time.After(time.Minute):
			t.Error("Serve did not return a minute after its context ended")
		}
	})
	return h
}

// client is a Go client with cn's certificate.
func (h *limitsHost) client(t *testing.T, cn string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: "https://" + h.addr, CA: h.pki.CAFile,
		Cert: filepath.Join(h.pki.Dir, cn+".pem"), Key: filepath.Join(h.pki.Dir, cn+"-key.pem")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wantAPIError fails unless err is the API error of kind whose message
// contains each of msgs.
func wantAPIError(t *testing.T, what string, err error, kind string, msgs ...string) {
	t.Helper()
	var e *remoteapi.Error
	if !errors.As(err, &e) || e.Kind != kind {
		t.Fatalf("%s: got %v (%T), want an API error of kind %s", what, err, err, kind)
	}
	for _, m := range msgs {
		if !strings.Contains(e.Message, m) {
			t.Errorf("%s: %q does not say %q", what, e.Message, m)
		}
	}
}

// TestLimitCallsPerClient: a client with max_calls_per_client calls in
// flight is refused its next one at once (too-many, audited), another
// client is served meanwhile, and the first is served again once its calls
// end.
func TestLimitCallsPerClient(t *testing.T) {
	h := startLimits(t, "max_calls_per_client = 2")
	a, b := h.client(t, "a"), h.client(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := a.Status(ctx, "slow")
			errs <- err
		}()
	}
	for range 2 {
		select {
		case <-h.ops.entered:
		case <-ctx.Done():
			t.Fatal("the two calls of cn:a never reached the operation")
		}
	}
	start := time.Now()
	_, err := a.Status(ctx, "quick")
	wantAPIError(t, "cn:a's third call", err, remoteapi.KindTooMany, "cn:a has 2 calls in flight already")
	t.Logf("third call refused in %v", time.Since(start).Round(time.Millisecond))
	if _, err := b.Status(ctx, "quick"); err != nil {
		t.Errorf("cn:b while cn:a is at its limit: %v", err)
	}
	close(h.ops.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a call in flight: %v", err)
		}
	}
	if _, err := a.Status(ctx, "quick"); err != nil {
		t.Errorf("cn:a once its calls ended: %v", err)
	}
	wantAudited(t, h, `"identity":"cn:a"`, "calls in flight already")
}

// wantAudited fails unless api-security.log has a line with all of parts.
func wantAudited(t *testing.T, h *limitsHost, parts ...string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.root, "remote", "api-security.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return
		}
	}
	t.Errorf("api-security.log has no line with %q:\n%s", parts, b)
}

// TestLimitRequestSize: a body over max_request is refused (too-large,
// audited) before it is parsed; one under it is read.
func TestLimitRequestSize(t *testing.T) {
	h := startLimits(t, "max_request = 1024")
	a := h.client(t, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	big := &spec.File{Path: "/here/big.toml", Raw: []byte("name = \"big\"\n# " + strings.Repeat("x", 2048) + "\n")}
	_, err := a.PlanWith(ctx, big, supervisor.PlanOptions{})
	wantAPIError(t, "a 2 KiB plan", err, remoteapi.KindTooLarge, "request body over 1024 bytes")
	wantAudited(t, h, `"identity":"cn:a"`, "POST /v1/plan", "request body over 1024 bytes")
	// On the wire: 413 and the error, for a body whose Content-Length is
	// over (refused before it is read) and for an endless chunked one (cut
	// off after max_request bytes).
	for _, body := range []io.Reader{strings.NewReader(strings.Repeat(" ", 2048) + "{}"), &endless{}} {
		req, _ := http.NewRequestWithContext(ctx, "POST", "https://"+h.addr+"/v1/plan", body)
		req.ContentLength = 2050
		if _, ok := body.(*endless); ok {
			req.ContentLength = -1
		}
		start := time.Now()
		resp, err := h.httpClient(t, "a").Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), `"kind":"too-large"`) ||
			!strings.Contains(string(b), "request body over 1024 bytes, the most this server reads (max_request)") {
			t.Errorf("a body of %d bytes: %s %s", req.ContentLength, resp.Status, b)
		}
		t.Logf("a body of %d bytes: %s in %v: %s", req.ContentLength, resp.Status, time.Since(start).Round(time.Millisecond), bytes.TrimSpace(b))
	}
	// Under the limit the file is read and parsed: its own error, not the size.
	_, err = a.PlanWith(ctx, &spec.File{Path: "/here/small.toml", Raw: []byte("name = \"small\"\nbogus = 1\n")}, supervisor.PlanOptions{})
	var e *remoteapi.Error
	if !errors.As(err, &e) || e.Kind == remoteapi.KindTooLarge {
		t.Errorf("a small file: %v, want its parse error", err)
	}
}

// endless is a request body that never ends.
type endless struct{}

func (*endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}

// httpClient is a plain HTTP client with cn's certificate.
func (h *limitsHost) httpClient(t *testing.T, cn string) *http.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(t, cn)}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// tlsConfig is a client's TLS configuration with cn's certificate.
func (h *limitsHost) tlsConfig(t *testing.T, cn string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(h.pki.Dir, cn+".pem"), filepath.Join(h.pki.Dir, cn+"-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
}

// TestLimitCallTimeout: a call past call_timeout ends with an error naming
// the limit, and no longer counts against its client.
func TestLimitCallTimeout(t *testing.T) {
	h := startLimits(t, "call_timeout = \"300ms\"\nmax_calls_per_client = 1")
	a := h.client(t, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	_, err := a.Status(ctx, "slow")
	took := time.Since(start)
	wantAPIError(t, "a call past call_timeout", err, remoteapi.KindFailed, "GET /v1/vms/{name}: stopped after call_timeout 300ms", "remote.toml", "deadline exceeded")
	if took > 30*time.Second {
		t.Errorf("the call took %v with call_timeout 300ms", took)
	}
	t.Logf("call ended after %v (call_timeout 300ms)", took.Round(time.Millisecond))
	if _, err := a.Status(ctx, "quick"); err != nil {
		t.Errorf("the next call of the client (max_calls_per_client 1): %v", err)
	}
}

// TestLimitSlowClients: clients trickling their request headers a byte at
// a time (slowloris) block no one: a real client is served meanwhile; they
// do not keep the server up (it exits idle_exit after the last call, plus
// at most net/http's 5 s for connections still in their headers), and
// none is answered.
func TestLimitSlowClients(t *testing.T) {
	const slow = 40
	h := startLimits(t, "idle_exit = \"1s\"")
	a := h.client(t, "a")
	conf := h.tlsConfig(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The first call, so the server does not exit before the slow
	// clients connect; then the slow clients, each with a TLS session.
	if _, err := a.Status(ctx, "quick"); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan string, slow)
	for i := range slow {
		go func() {
			d := tls.Dialer{Config: conf}
			c, err := d.DialContext(ctx, "tcp", h.addr)
			if err != nil {
				dropped <- fmt.Sprintf("slow client %d: dial: %v", i, err)
				return
			}
			defer c.Close()
			req := "GET /v1/vms/quick HTTP/1.1\r\nHost: vmsup\r\nX-Slow: " + strings.Repeat("s", 1000)
			for j := 0; ; j++ {
				c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write([]byte{req[j%len(req)]}); err != nil {
					dropped <- ""
					return
				}
				c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				var b [512]byte
				n, err := c.Read(b[:])
				if n > 0 {
					dropped <- fmt.Sprintf("slow client %d was answered: %q", i, b[:n])
					return
				}
				var ne net.Error
				if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
					dropped <- ""
					return
				}
			}
		}()
	}
	time.Sleep(time.Second) // the slow clients are connected and trickling
	for i := range 3 {
		start := time.Now()
		if _, err := a.Status(ctx, "quick"); err != nil {
			t.Fatalf("a real client among %d slow ones: %v", slow, err)
		}
		took := time.Since(start)
		t.Logf("call %d among %d slow clients: %v", i, slow, took.Round(time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("a real client among %d slow ones waited %v", slow, took)
		}
	}
	last := time.Now()
	select {
	case at := <-h.servedAt:
		t.Logf("server exited %v after the last call, %d slow clients connected", at.Sub(last).Round(time.Millisecond), slow)
		if d := at.Sub(last); d > 30*time.Second {
			t.Errorf("the server exited %v after the last call (idle_exit 1s)", d)
		}
		if err := <-h.served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		h.served <- nil // for the cleanup
	case <-ctx.Done():
		t.Fatal("slow clients kept the server up")
	}
	for range slow {
		select {
		case msg := <-dropped:
			if msg != "" {
				t.Error(msg)
			}
		case <-ctx.Done():
			t.Fatal("a slow client was never dropped")
		}
	}
}

// trickle writes head at once, then a byte of body every 200 ms, until
// the server answers or drops the connection: what it answered and when.
func trickle(ctx context.Context, conf *tls.Config, addr, head, body string) (string, time.Duration, error) {
	d := tls.Dialer{Config: conf}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	start := time.Now()
	c.Write([]byte(head))
	var got []byte
	for j := 0; ctx.Err() == nil; j++ {
		if _, err := c.Write([]byte{body[j%len(body)]}); err != nil {
			break
		}
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		var b [4096]byte
		n, err := c.Read(b[:])
		got = append(got, b[:n]...)
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			break
		}
	}
	return string(got), time.Since(start), ctx.Err()
}

// TestLimitSlowRequest: a client that sends its headers, or its body, a
// byte at a time is cut off after 10 s (headers: net/http's
// ReadHeaderTimeout, no answer; body: the API's body timeout, with an
// error saying so) while the server is kept up by another call, and the
// call it made does not hold the server up.
func TestLimitSlowRequest(t *testing.T) {
	h := startLimits(t, "idle_exit = \"1s\"")
	a := h.client(t, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held := make(chan error, 1)
	go func() {
		_, err := a.Status(ctx, "slow") // keeps the server up until released
		held <- err
	}()
	<-h.ops.entered
	type cut struct {
		what, answer string
		after        time.Duration
	}
	cuts := make(chan cut, 2)
	conf := h.tlsConfig(t, "b")
	go func() {
		got, after, _ := trickle(ctx, conf, h.addr, "", "GET /v1/vms/quick HTTP/1.1\r\nHost: vmsup\r\nX-Slow: "+strings.Repeat("s", 1000))
		cuts <- cut{"headers", got, after}
	}()
	go func() {
		got, after, _ := trickle(ctx, conf, h.addr, "POST /v1/plan HTTP/1.1\r\nHost: vmsup\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{", "        ")
		cuts <- cut{"body", got, after}
	}()
	for range 2 {
		c := <-cuts
		t.Logf("slow %s: cut off after %v: %q", c.what, c.after.Round(time.Millisecond), c.answer)
		if c.after < 9*time.Second || c.after > 20*time.Second {
			t.Errorf("slow %s: cut off after %v, want about 10 s", c.what, c.after)
		}
		switch c.what {
		case "headers":
			if c.answer != "" {
				t.Errorf("slow headers were answered: %q", c.answer)
			}
		case "body":
			if !strings.HasPrefix(c.answer, "HTTP/1.1 400 ") || !strings.Contains(c.answer, "vmsup api: request body: not received within 10s") {
				t.Errorf("slow body answered %q, want 400 saying it was not received in time", c.answer)
			}
		}
	}
	wantAudited(t, h, `"identity":"cn:b"`, "POST /v1/plan", "not received within 10s")
	close(h.ops.release)
	if err := <-held; err != nil {
		t.Errorf("the call that kept the server up: %v", err)
	}
	h.exited(t, ctx, "the last call")
}

// exited waits for the server to exit after what just happened.
func (h *limitsHost) exited(t *testing.T, ctx context.Context, after string) {
	t.Helper()
	since := time.Now()
	select {
	case at := <-h.servedAt:
		t.Logf("server exited %v after %s", at.Sub(since).Round(time.Millisecond), after)
	case <-ctx.Done():
		t.Fatalf("the server did not exit after %s", after)
	}
}

// FollowEvents streams events of 1 KiB until its call ends (the stream
// a client that stops reading leaves behind).
func (o *blockingOps) FollowEvents(ctx context.Context, _ []string, _ time.Time, _ bool, emit func(supervisor.Event) error) error {
	pad := strings.Repeat("x", 1024)
	for ctx.Err() == nil {
		if err := emit(supervisor.Event{VM: "quick", Kind: "PAD", Data: map[string]any{"pad": pad}}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// TestLimitStalledReader: a client that asks for a followed stream and
// never reads it loses the call once a write has waited 10 s (its buffers
// full), so it keeps neither its call slot nor the server up; its
// connection may stay open.
func TestLimitStalledReader(t *testing.T) {
	t.Parallel()
	h := startLimits(t, "idle_exit = \"1s\"")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := tls.Dialer{Config: h.tlsConfig(t, "b")}
	c, err := d.DialContext(ctx, "tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte("GET /v1/events?follow=true HTTP/1.1\r\nHost: vmsup\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	select { // never read: the server's writes fill the buffers, then wait
	case at := <-h.servedAt:
		took := at.Sub(start)
		t.Logf("server exited %v after the stalled stream began", took.Round(time.Millisecond))
		if took < 9*time.Second || took > 30*time.Second {
			t.Errorf("server exited %v after a stalled stream began, want about 10 s (write timeout) + 1 s (idle_exit)", took)
		}
	case <-ctx.Done():
		t.Fatal("a client that never reads its stream kept the server up")
	}
}
