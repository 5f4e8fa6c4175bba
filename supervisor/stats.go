package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/observe/stats"
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
	return stats.NewCollector(s.env).Stats(ctx, names...)
}
