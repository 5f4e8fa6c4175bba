package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/vmsup/vmsup/internal/vmstats"
	"github.com/vmsup/vmsup/units"
)

// Prometheus metrics with no resident process: WriteMetrics renders
// Stats in the text exposition format, and InstallMetrics installs a
// socket-activated unit pair whose per-connection instance runs one short
// vmsup process per scrape (vmsup metrics --http).

// MetricsUnit is the name of the unit pair (.socket, @.service).
const MetricsUnit = "vmsup-metrics"

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

// MetricsInstall is what InstallMetrics installs.
type MetricsInstall struct {
	Listen    string   // ListenStream= address, e.g. "127.0.0.1:9475"
	ExecStart []string // the scrape command: vmsup [global flags] metrics --http
	WantedBy  string   // default "sockets.target"
}

func (m MetricsInstall) service() units.SocketService {
	return units.SocketService{Name: MetricsUnit, Description: "vmsup metrics: Prometheus endpoint, one vmsup run per scrape",
		Listen: m.Listen, ExecStart: m.ExecStart, MaxSeconds: 30, WantedBy: cmp.Or(m.WantedBy, "sockets.target")}
}

// InstallMetrics installs the unit pair into Options.UnitDir and starts
// the socket. An address in use or an installed pair is refused before
// anything is written; a socket systemd cannot start is removed again.
func (s *Supervisor) InstallMetrics(ctx context.Context, m MetricsInstall) error {
	if l, err := net.Listen("tcp", m.Listen); err != nil {
		return fmt.Errorf("--listen %s: %w", m.Listen, err)
	} else {
		l.Close()
	}
	svc := m.service()
	if err := svc.Install(s.opts.UnitDir); err != nil {
		if errors.Is(err, units.ErrInstalled) {
			return fmt.Errorf("metrics units: %w (vmsup metrics --uninstall removes them)", err)
		}
		return fmt.Errorf("metrics units in %s: %w", s.opts.UnitDir, err)
	}
	sd, err := s.systemd(ctx)
	if err == nil {
		if err = sd.Reload(ctx); err == nil {
			err = sd.StartUnit(ctx, svc.SocketUnit())
		}
	}
	if err != nil {
		_, _ = svc.Uninstall(s.opts.UnitDir)
		if sd != nil {
			_ = sd.Stop(ctx, svc.SocketUnit())
			_ = sd.ResetFailed(ctx, svc.SocketUnit())
			_ = sd.Reload(ctx)
		}
		return fmt.Errorf("metrics socket %s: %w (nothing left installed)", m.Listen, err)
	}
	return nil
}

// UninstallMetrics stops the socket and removes the unit pair.
func (s *Supervisor) UninstallMetrics(ctx context.Context) error {
	svc := MetricsInstall{}.service()
	sd, err := s.systemd(ctx)
	if err != nil {
		return err
	}
	if err := sd.Stop(ctx, svc.SocketUnit()); err != nil {
		return err
	}
	found, err := svc.Uninstall(s.opts.UnitDir)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("metrics units: none in %s", s.opts.UnitDir)
	}
	return sd.Reload(ctx)
}
