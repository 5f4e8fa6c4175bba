// Package vmstats owns vmsup's per-VM statistics as the host sees them and
// their rendering: the typed stats that `vmsup stats --json` prints, the
// collectors that read them from the host (the unit's cgroup, QEMU's /proc
// entries, the tap devices' netlink counters) and the Prometheus text
// exposition that `vmsup metrics` serves.
//
// Collector (collect.go) gathers a state root's VMs' figures: systemd's
// accounting and the host's counters itself, disk, balloon and guest memory
// figures over each VM's QMP monitor, which the machine.Env opens one client
// at a time. It keeps no state between calls; each scrape is a
// fresh process that collects, renders and exits.
package stats
