// Package vmstats owns vmsup's per-VM statistics as the host sees them and
// their rendering: the typed stats that `vmsup stats --json` prints, the
// collectors that read them from the host (the unit's cgroup, QEMU's /proc
// entries, the tap devices' netlink counters) and the Prometheus text
// exposition that `vmsup metrics` serves.
//
// It does not talk to QEMU: disk, balloon and guest memory figures come from
// QMP and are filled in by the caller. It keeps no state between calls; each
// scrape is a fresh process that collects, renders and exits.
package vmstats
