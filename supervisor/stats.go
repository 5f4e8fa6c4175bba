package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/observe/stats"
	"github.com/vmsup/vmsup/internal/observe/status"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// VMStats are one VM's figures: CPU, memory, disks, NICs, uptime
// (internal/observe/stats says where each comes from and collects them).
type VMStats = stats.VM

// StatsSkipped is a VM Stats left out, and why (being started or stopped).
type StatsSkipped = stats.Skipped

// Stats reads the figures of the named VMs (every VM vmsup knows when none
// is named). It only reads; a VM being started or stopped is skipped; a
// named VM that does not exist is an error.
func (s *Supervisor) Stats(ctx context.Context, names ...string) ([]VMStats, []StatsSkipped, error) {
	return stats.NewCollector(statsHost{s}).Stats(ctx, names...)
}

// statsHost is the stats collector's Host.
type statsHost struct{ s *Supervisor }

var _ stats.Host = statsHost{}

func (h statsHost) State() vmstore.Store                                { return h.s.env.State() }
func (h statsHost) Known() ([]string, error)                            { return h.s.env.State().Known() }
func (h statsHost) Absent(name string) error                            { return h.s.env.Absent(name) }
func (h statsHost) Systemd(ctx context.Context) (*units.Manager, error) { return h.s.env.Systemd(ctx) }
func (h statsHost) QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	return h.s.env.QMPSession(ctx, name)
}
func (h statsHost) View(name string) (*vmstore.View, error) { return h.s.env.View(name) }
func (h statsHost) Taps(name string) []nics.Tap             { return h.s.env.Net().Taps(name) }
func (h statsHost) QEMUState(qs qmp.StatusInfo) string {
	st, _ := status.QEMUState(qs)
	return string(st)
}
