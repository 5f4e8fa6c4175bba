// Package metrics serves the VMs' figures to Prometheus with no resident
// process: Endpoint.Write renders them (internal/observe/stats collects them) in
// the text exposition format, and Endpoint.Install installs two
// socket-activated unit pairs that run one short vmsup per scrape:
//
//   - the endpoint (vmsup-metrics.socket, the network's side): each
//     connection's instance (vmsup metrics --http-via) runs as a dynamic
//     user with no capabilities, no network of its own and no view of the
//     VMs; it reads the HTTP request (a client idle for scrapeIdle is
//     dropped, ServeScrape) and asks the collector (CollectVia);
//   - the collector (vmsup-metrics-collect.socket, a unix socket): each
//     instance (vmsup metrics --collect, Endpoint.Collect) reads every VM's
//     figures and writes them, reading nothing from its client. It runs as
//     root, because the figures are behind root-only records and each
//     QEMU's monitor socket (its own user's, mode 0700), with only the
//     capabilities that reach them and a read-only view of the host.
//
// It does not collect the figures: internal/observe/stats does, over the
// machine.Env.
package metrics

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/observe/stats"
)

// Bounds of one scrape: an endpoint instance drops a client that sent no
// request within scrapeIdle (so idle connections free their place fast);
// the collector's answer takes at most collectTimeout.
const (
	scrapeIdle     = 3 * time.Second
	maxRequest     = 64 << 10
	collectTimeout = 25 * time.Second
)

// source is where the endpoint's figures and systemd come from: the Env
// (envSource); the tests fake it.
type source interface {
	// Stats reads every VM's figures, and the VMs it left out (being
	// started or stopped).
	Stats(ctx context.Context) ([]stats.VM, []stats.Skipped, error)
	// Systemd is the systemd the units are installed for.
	Systemd(ctx context.Context) (Systemd, error)
}

// Systemd is what installing the units asks systemd (a *units.Manager).
type Systemd interface {
	Reload(ctx context.Context) error
	StartUnit(ctx context.Context, name string) error
	Stop(ctx context.Context, name string) error
	ResetFailed(ctx context.Context, name string) error
}

// envSource is the Env's figures (stats.Collector) and systemd.
type envSource struct{ env *machine.Env }

func (s envSource) Stats(ctx context.Context) ([]stats.VM, []stats.Skipped, error) {
	return stats.NewCollector(s.env).Stats(ctx)
}

func (s envSource) Systemd(ctx context.Context) (Systemd, error) {
	sd, err := s.env.Systemd(ctx)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return sd, nil
}

// Endpoint is a state root's metrics: the figures and the units that
// serve them, which run the Env's Options.Self on its Root and are
// installed into its UnitDir.
type Endpoint struct {
	o   *machine.Options
	src source
}

// New returns the metrics of env's VMs.
func New(env *machine.Env) *Endpoint { return &Endpoint{o: env.Opts(), src: envSource{env}} }

// Write writes every VM's figures to w, Prometheus's text format. VMs being
// started or stopped are left out, each named in vmsup_scrape_skipped.
func (e *Endpoint) Write(ctx context.Context, w io.Writer) error {
	vms, skipped, err := e.src.Stats(ctx)
	if err != nil {
		return err
	}
	return stats.WritePrometheus(w, vms, skipped)
}

// Collect is the collector's work ("vmsup metrics --collect"): a first
// line "ok" and the figures, or "error: WHY".
func (e *Endpoint) Collect(ctx context.Context, w io.Writer) error {
	var body bytes.Buffer
	if err := e.Write(ctx, &body); err != nil {
		_, werr := fmt.Fprintf(w, "error: %s\n", oneLine(err.Error()))
		return errors.Join(err, werr)
	}
	if _, err := io.WriteString(w, "ok\n"); err != nil {
		return err
	}
	_, err := w.Write(body.Bytes())
	return err
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// CollectVia returns a source of figures for ServeScrape: the collector
// listening at socket.
func CollectVia(socket string) func(context.Context, io.Writer) error {
	return func(ctx context.Context, w io.Writer) error {
		ctx, cancel := context.WithTimeout(ctx, collectTimeout)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", socket)
		if err != nil {
			return fmt.Errorf("metrics collector: %w", err)
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		r := bufio.NewReader(c)
		first, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("metrics collector: %w", err)
		}
		if first != "ok\n" {
			return fmt.Errorf("metrics collector: %s", strings.TrimSpace(strings.TrimPrefix(first, "error: ")))
		}
		if _, err := io.Copy(w, r); err != nil {
			return fmt.Errorf("metrics collector: %w", err)
		}
		return nil
	}
}

// ServeScrape answers the one HTTP request on conn (a socket-activated
// instance's connection): GET or HEAD /metrics gets the figures collect
// writes, anything else a 404. A client that has not sent its request
// within scrapeIdle is dropped: idle connections must not hold the
// endpoint's places.
func ServeScrape(ctx context.Context, conn net.Conn, collect func(context.Context, io.Writer) error) error {
	_ = conn.SetReadDeadline(time.Now().Add(scrapeIdle))
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(conn, maxRequest)))
	if err != nil {
		return fmt.Errorf("metrics: read request: %w", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if req.URL.Path != "/metrics" || (req.Method != http.MethodGet && req.Method != http.MethodHead) {
		return writeHTTP(conn, "404 Not Found", "text/plain", "vmsup serves /metrics\n", false)
	}
	var body strings.Builder
	if err := collect(ctx, &body); err != nil {
		return errors.Join(err, writeHTTP(conn, "500 Internal Server Error", "text/plain", err.Error()+"\n", false))
	}
	return writeHTTP(conn, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body.String(), req.Method == http.MethodHead)
}

func writeHTTP(w io.Writer, status, ctype, body string, head bool) error {
	_, err := fmt.Fprintf(w, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", status, ctype, len(body))
	if err != nil || head {
		return err
	}
	_, err = io.WriteString(w, body)
	return err
}
