package metrics

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/observe/stats"
)

// standIn is the endpoint's source without VMs or systemd: its figures and
// systemd's answers are what a test says.
type standIn struct {
	mu       sync.Mutex // statsErr: the collector runs beside the test
	vms      []stats.VM
	skipped  []stats.Skipped
	statsErr error
	startErr error
	calls    []string // systemd calls, in order
}

func (h *standIn) Stats(context.Context) ([]stats.VM, []stats.Skipped, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.vms, h.skipped, h.statsErr
}

func (h *standIn) failStats(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.statsErr = err
}
func (h *standIn) Systemd(context.Context) (Systemd, error) { return h, nil }
func (h *standIn) Reload(context.Context) error             { h.calls = append(h.calls, "reload"); return nil }
func (h *standIn) Stop(_ context.Context, n string) error {
	h.calls = append(h.calls, "stop "+n)
	return nil
}
func (h *standIn) ResetFailed(_ context.Context, n string) error {
	h.calls = append(h.calls, "reset-failed "+n)
	return nil
}
func (h *standIn) StartUnit(_ context.Context, n string) error {
	h.calls = append(h.calls, "start "+n)
	if n == Unit+".socket" {
		return h.startErr
	}
	return nil
}

// newEndpoint is the endpoint of a real Env with o (a state root of its
// own unless o says), its figures and systemd from src unless that is nil.
func newEndpoint(t *testing.T, src source, o machine.Options) *Endpoint {
	t.Helper()
	if o.Root == "" {
		o.Root = t.TempDir()
	}
	env, err := machine.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	e := New(env)
	if src != nil {
		e.src = src
	}
	return e
}

// TestCollect: the collector writes "ok" and the figures, or the reason it
// has none on one line: a stand-in's, and a real Env's whose systemd is
// not there.
func TestCollect(t *testing.T) {
	h := &standIn{vms: []stats.VM{{Name: "web", State: "running", Up: true}}, skipped: []stats.Skipped{{Name: "db", Reason: "starting"}}}
	var out strings.Builder
	if err := newEndpoint(t, h, machine.Options{}).Collect(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	first, body, _ := strings.Cut(out.String(), "\n")
	if first != "ok" || !strings.Contains(body, `vm="web"`) || !strings.Contains(body, "vmsup_scrape_skipped") {
		t.Errorf("Collect wrote %q", out.String())
	}

	h.failStats(errors.New("systemd:\n  no bus"))
	out.Reset()
	if err := newEndpoint(t, h, machine.Options{}).Collect(context.Background(), &out); err == nil || !strings.Contains(err.Error(), "no bus") {
		t.Errorf("Collect = %v, want the figures' error", err)
	}
	if out.String() != "error: systemd: no bus\n" {
		t.Errorf("Collect wrote %q, want the error on one line", out.String())
	}

	bus := "unix:path=" + filepath.Join(t.TempDir(), "no-bus")
	out.Reset()
	if err := newEndpoint(t, nil, machine.Options{SystemdBus: bus}).Collect(context.Background(), &out); err == nil ||
		!strings.HasPrefix(out.String(), "error: ") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("Collect without systemd = %v, wrote %q; want the error on one line", err, out.String())
	}
}

// TestScrape: a request to an endpoint instance asks the collector at its
// socket and answers with its figures, or says why it cannot.
func TestScrape(t *testing.T) {
	h := &standIn{vms: []stats.VM{{Name: "web", State: "running", Up: true}}}
	sock := filepath.Join(t.TempDir(), "collect.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e := newEndpoint(t, h, machine.Options{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = e.Collect(context.Background(), c)
			c.Close()
		}
	}()
	for _, c := range []struct {
		request, status, body string
		fail                  error
	}{
		{request: "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", status: "200 OK", body: `vm="web"`},
		{request: "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", status: "200 OK"},
		{request: "GET / HTTP/1.1\r\nHost: x\r\n\r\n", status: "404 Not Found", body: "vmsup serves /metrics"},
		{request: "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", status: "404 Not Found"},
		{request: "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", status: "500 Internal Server Error", body: "metrics collector: no bus",
			fail: errors.New("no bus")},
	} {
		h.failStats(c.fail)
		client, server := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- ServeScrape(context.Background(), server, CollectVia(sock)); server.Close() }()
		go func() { _, _ = io.WriteString(client, c.request) }()
		method, _, _ := strings.Cut(c.request, " ")
		resp, err := http.ReadResponse(bufio.NewReader(client), &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%q: %v", c.request, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%q: body: %v", c.request, err)
		}
		client.Close()
		serr := <-done
		if resp.Status != c.status || !strings.Contains(string(body), c.body) || (serr != nil) != (c.fail != nil) {
			t.Errorf("%q: %s %q, ServeScrape %v; want %s with %q", c.request, resp.Status, body, serr, c.status, c.body)
		}
		if strings.HasPrefix(c.request, "HEAD") && (len(body) != 0 || resp.ContentLength == 0) {
			t.Errorf("HEAD: body %q, Content-Length %d; want only the length", body, resp.ContentLength)
		}
	}
}

// TestInstall: both unit pairs are written and their sockets started; a
// socket systemd cannot start leaves nothing installed, and a second
// install is refused before anything is written.
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	h := &standIn{}
	e := newEndpoint(t, h, machine.Options{Root: "/var/lib/vmsup", UnitDir: dir, Self: "/usr/bin/vmsup"})
	if err := e.Install(context.Background(), Install{Listen: "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"reload", "start " + CollectUnit + ".socket", "start " + Unit + ".socket"}
	if !slices.Equal(h.calls, want) {
		t.Errorf("systemd calls %q, want %q", h.calls, want)
	}
	collect, err := os.ReadFile(filepath.Join(dir, CollectUnit+"@.service"))
	if err != nil || !strings.Contains(string(collect), "/usr/bin/vmsup --root /var/lib/vmsup metrics --collect") {
		t.Errorf("collector unit: %v\n%s", err, collect)
	}
	if err := e.Install(context.Background(), Install{Listen: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "--uninstall") {
		t.Errorf("second Install = %v, want refused", err)
	}
	h.calls = nil
	if err := e.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.Uninstall(context.Background()); err == nil {
		t.Error("Uninstall with nothing installed passed")
	}

	h.calls, h.startErr = nil, errors.New("address in use")
	if err := e.Install(context.Background(), Install{Listen: "127.0.0.1:0"}); !errors.Is(err, h.startErr) {
		t.Fatalf("Install = %v, want the socket's failure", err)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, "*.s*")); len(ents) != 0 {
		t.Errorf("left installed: %v", ents)
	}
	if !slices.Contains(h.calls, "reset-failed "+Unit+".socket") || h.calls[len(h.calls)-1] != "reload" {
		t.Errorf("undo: systemd calls %q", h.calls)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := e.Install(context.Background(), Install{Listen: l.Addr().String()}); err == nil || !strings.HasPrefix(err.Error(), "--listen") {
		t.Errorf("Install on a taken address = %v, want refused", err)
	}
}
