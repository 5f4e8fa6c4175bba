package supervisor

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/vmstats"
	"github.com/vmsup/vmsup/units"
)

// Prometheus metrics with no resident process: WriteMetrics renders
// Stats in the text exposition format, and InstallMetrics installs two
// socket-activated unit pairs that run one short vmsup per scrape:
//
//   - the endpoint (vmsup-metrics.socket, the network's side): each
//     connection's instance (vmsup metrics --http-via) runs as a dynamic
//     user with no capabilities, no network of its own and no view of the
//     VMs; it reads the HTTP request (a client idle for scrapeIdle is
//     dropped) and asks the collector;
//   - the collector (vmsup-metrics-collect.socket, a unix socket): each
//     instance (vmsup metrics --collect) reads every VM's figures and
//     writes them, reading nothing from its client. It runs as root,
//     because the figures are behind root-only records and each QEMU's
//     monitor socket (its own user's, mode 0700), with only the
//     capabilities that reach them and a read-only view of the host.

// MetricsUnit is the name of the endpoint's unit pair (.socket, @.service).
const MetricsUnit = "vmsup-metrics"

// MetricsCollectUnit is the name of the collector's unit pair.
const MetricsCollectUnit = "vmsup-metrics-collect"

// MetricsCollectSocket is where the collector listens.
const MetricsCollectSocket = "/run/vmsup-metrics.sock"

// metricsUser is the endpoint's dynamic user.
const metricsUser = "vmsup-metrics"

// Bounds of one scrape: an endpoint instance drops a client that sent no
// request within scrapeIdle (so idle connections free their place fast);
// the collector's answer takes at most collectTimeout.
const (
	scrapeIdle       = 3 * time.Second
	maxRequest       = 64 << 10
	collectTimeout   = 25 * time.Second
	metricsInstances = 30 // RuntimeMaxSec= of one instance, seconds
)

// collectorCaps are the collector's capabilities: read the root-only
// records and lock files, connect to QEMU users' monitor sockets (write
// permission on the socket: DAC_OVERRIDE), and read the taps of a VM in a
// network namespace (setns: SYS_ADMIN).
func collectorCaps() []string {
	return []string{"CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_SYS_ADMIN"}
}

// WriteMetrics writes every VM's figures to w, Prometheus's text format.
// VMs being started or stopped are left out, each named in
// vmsup_scrape_skipped.
func (s *Supervisor) WriteMetrics(ctx context.Context, w io.Writer) error {
	vms, skipped, err := s.Stats(ctx)
	if err != nil {
		return err
	}
	return vmstats.WritePrometheus(w, vms, skipped)
}

// CollectMetrics is the collector's work ("vmsup metrics --collect"): a
// first line "ok" and the figures, or "error: WHY".
func (s *Supervisor) CollectMetrics(ctx context.Context, w io.Writer) error {
	var body bytes.Buffer
	if err := s.WriteMetrics(ctx, &body); err != nil {
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

// MetricsInstall is what InstallMetrics installs.
type MetricsInstall struct {
	Listen   string // the endpoint's ListenStream= address, e.g. "127.0.0.1:9475"
	Self     string // the vmsup binary the units run (default Options.Self)
	WantedBy string // default "sockets.target"
}

// services are the endpoint's and the collector's unit pairs.
func (m MetricsInstall) services(root string) (endpoint, collector units.SocketService) {
	wanted := cmp.Or(m.WantedBy, "sockets.target")
	collector = units.SocketService{Name: MetricsCollectUnit, Description: "vmsup metrics: every VM's figures, for the endpoint",
		Listen: MetricsCollectSocket, SocketMode: 0o666, MaxConnections: 8, MaxPerSource: 8,
		ExecStart: []string{m.Self, "--root", root, "metrics", "--collect"}, MaxSeconds: metricsInstances, WantedBy: wanted,
		Sandbox: &units.Sandbox{Capabilities: collectorCaps(), Netlink: true, SeeProcesses: true,
			ReadOnlyBindPaths: []string{m.Self, root}}}
	endpoint = units.SocketService{Name: MetricsUnit, Description: "vmsup metrics: Prometheus endpoint, one vmsup run per scrape",
		Listen: m.Listen, MaxConnections: 64, MaxPerSource: 8,
		ExecStart: []string{m.Self, "metrics", "--http-via", MetricsCollectSocket}, MaxSeconds: metricsInstances, WantedBy: wanted,
		Requires: []string{collector.SocketUnit()},
		Sandbox:  &units.Sandbox{User: metricsUser, DynamicUser: true, ReadOnlyBindPaths: []string{m.Self}}}
	return endpoint, collector
}

// InstallMetrics installs both unit pairs into Options.UnitDir and starts
// the sockets. An address in use or an installed pair is refused before
// anything is written; sockets systemd cannot start are removed again.
func (s *Supervisor) InstallMetrics(ctx context.Context, m MetricsInstall) error {
	if l, err := net.Listen("tcp", m.Listen); err != nil {
		return fmt.Errorf("--listen %s: %w", m.Listen, err)
	} else {
		l.Close()
	}
	m.Self = cmp.Or(m.Self, s.opts.Self)
	endpoint, collector := m.services(s.opts.Root)
	all := []units.SocketService{collector, endpoint}
	var done []units.SocketService
	undo := func(sd *units.Manager) {
		for _, svc := range done {
			_, _ = svc.Uninstall(s.opts.UnitDir)
			if sd != nil {
				_ = sd.Stop(ctx, svc.SocketUnit())
				_ = sd.ResetFailed(ctx, svc.SocketUnit())
			}
		}
		if sd != nil {
			_ = sd.Reload(ctx)
		}
	}
	for _, svc := range all {
		if err := svc.Install(s.opts.UnitDir); err != nil {
			undo(nil)
			if errors.Is(err, units.ErrInstalled) {
				return fmt.Errorf("metrics units: %w (vmsup metrics --uninstall removes them)", err)
			}
			return fmt.Errorf("metrics units in %s: %w", s.opts.UnitDir, err)
		}
		done = append(done, svc)
	}
	sd, err := s.systemd(ctx)
	if err == nil {
		if err = sd.Reload(ctx); err == nil {
			for _, svc := range all {
				if err = sd.StartUnit(ctx, svc.SocketUnit()); err != nil {
					break
				}
			}
		}
	}
	if err != nil {
		undo(sd)
		return fmt.Errorf("metrics socket %s: %w (nothing left installed)", m.Listen, err)
	}
	return nil
}

// UninstallMetrics stops the sockets and removes both unit pairs (or the
// one pair an older vmsup installed).
func (s *Supervisor) UninstallMetrics(ctx context.Context) error {
	endpoint, collector := MetricsInstall{}.services(s.opts.Root)
	sd, err := s.systemd(ctx)
	if err != nil {
		return err
	}
	found := false
	for _, svc := range []units.SocketService{endpoint, collector} {
		if err := sd.Stop(ctx, svc.SocketUnit()); err != nil {
			return err
		}
		f, err := svc.Uninstall(s.opts.UnitDir)
		if err != nil {
			return err
		}
		found = found || f
	}
	if !found {
		return fmt.Errorf("metrics units: none in %s", s.opts.UnitDir)
	}
	return sd.Reload(ctx)
}
