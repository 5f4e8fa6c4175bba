package supervisor

import (
	"context"
	"io"
	"net"

	"github.com/vmsup/vmsup/internal/observe/metrics"
)

// Prometheus metrics with no resident process live in internal/observe/metrics:
// the figures rendered, and the socket-activated endpoint and collector
// units that serve them. Here is the library's API.

// MetricsUnit is the name of the endpoint's unit pair (.socket, @.service).
const MetricsUnit = metrics.Unit

// MetricsCollectUnit is the name of the collector's unit pair.
const MetricsCollectUnit = metrics.CollectUnit

// MetricsCollectSocket is where the collector listens.
const MetricsCollectSocket = metrics.CollectSocket

// MetricsInstall is what InstallMetrics installs.
type MetricsInstall = metrics.Install

// WriteMetrics writes every VM's figures to w, Prometheus's text format.
// VMs being started or stopped are left out, each named in
// vmsup_scrape_skipped.
func (s *Supervisor) WriteMetrics(ctx context.Context, w io.Writer) error {
	return s.metrics().Write(ctx, w)
}

// CollectMetrics is the collector's work ("vmsup metrics --collect"): a
// first line "ok" and the figures, or "error: WHY".
func (s *Supervisor) CollectMetrics(ctx context.Context, w io.Writer) error {
	return s.metrics().Collect(ctx, w)
}

// CollectVia returns a source of figures for ServeScrape: the collector
// listening at socket.
func CollectVia(socket string) func(context.Context, io.Writer) error {
	return metrics.CollectVia(socket)
}

// ServeScrape answers the one HTTP request on conn (a socket-activated
// instance's connection): GET or HEAD /metrics gets the figures collect
// writes, anything else a 404; a client idle for long is dropped.
func ServeScrape(ctx context.Context, conn net.Conn, collect func(context.Context, io.Writer) error) error {
	return metrics.ServeScrape(ctx, conn, collect)
}

// InstallMetrics installs both unit pairs into Options.UnitDir and starts
// the sockets. An address in use or an installed pair is refused before
// anything is written; sockets systemd cannot start are removed again.
func (s *Supervisor) InstallMetrics(ctx context.Context, m MetricsInstall) error {
	return s.metrics().Install(ctx, m)
}

// UninstallMetrics stops the sockets and removes both unit pairs (or the
// one pair an older vmsup installed).
func (s *Supervisor) UninstallMetrics(ctx context.Context) error { return s.metrics().Uninstall(ctx) }

func (s *Supervisor) metrics() *metrics.Endpoint { return metrics.New(s.env) }

// UnitFiles are the persistent units vmsup installs by command, rendered
// with this supervisor's options and not installed: the boot unit (vmsup
// enable) and the metrics endpoint's pairs listening on listen (vmsup
// metrics --install). A package ships them disabled.
func (s *Supervisor) UnitFiles(listen string) (map[string][]byte, error) {
	files, err := s.metrics().UnitFiles(metrics.Install{Listen: listen})
	if err != nil {
		return nil, err
	}
	boot, err := s.env.AutostartMarks().BootUnitFile()
	if err != nil {
		return nil, err
	}
	files[BootUnitName] = boot
	return files, nil
}
