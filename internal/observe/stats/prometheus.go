package stats

import (
	"cmp"
	"fmt"
	"io"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// WritePrometheus writes vms and skipped in the Prometheus text exposition
// format, every family with HELP and TYPE, sorted by name and within a
// family by vm, then device. It uses a private pedantic registry, so a
// scrape carries no process or Go runtime metrics, and a duplicate series
// (two VMs, or two disks of one VM, with one name) fails the whole write
// before anything is written.
func WritePrometheus(w io.Writer, vms []VM, skipped []Skipped) error {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newCollector(vms, skipped)); err != nil {
		return fmt.Errorf("prometheus: register: %w", err)
	}
	families, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("prometheus: gather: %w", err)
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range families {
		// Gather sorts series by label values in label-name order, which
		// puts disk and nic before vm; group them by VM instead.
		slices.SortStableFunc(mf.Metric, func(a, b *dto.Metric) int {
			return cmp.Compare(labelValue(a, "vm"), labelValue(b, "vm"))
		})
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("prometheus: encode %s: %w", mf.GetName(), err)
		}
	}
	return nil
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// vmMetric is a per-VM series; value's false means unknown, and the series
// is left out rather than exported as 0.
type vmMetric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(*VM) (float64, bool)
}

type diskMetric struct {
	desc  *prometheus.Desc
	value func(*Disk) float64
}

type nicMetric struct {
	desc  *prometheus.Desc
	value func(*NIC) float64
}

// collector emits one scrape's VMs as const metrics.
type collector struct {
	vms     []VM
	skipped []Skipped

	up, info, scrapeVMs, scrapeSkipped *prometheus.Desc
	diskStalled                        *prometheus.Desc
	perVM                              []vmMetric
	perDisk                            []diskMetric
	perNIC                             []nicMetric
}

func newCollector(vms []VM, skipped []Skipped) *collector {
	vm := []string{"vm"}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("vmsup_"+name, help, labels, nil)
	}
	known := func(v uint64) (float64, bool) { return float64(v), v != 0 }
	vmm := func(name string, typ prometheus.ValueType, help string, value func(*VM) (float64, bool)) vmMetric {
		return vmMetric{desc(name, help, vm...), typ, value}
	}
	always := func(f func(*VM) float64) func(*VM) (float64, bool) {
		return func(v *VM) (float64, bool) { return f(v), true }
	}
	disk := func(name, help string, value func(*Disk) float64) diskMetric {
		return diskMetric{desc("vm_disk_"+name, help, "vm", "disk"), value}
	}
	nic := func(name, help string, value func(*NIC) float64) nicMetric {
		return nicMetric{desc("vm_nic_"+name, help, "vm", "nic"), value}
	}
	return &collector{
		vms:           vms,
		skipped:       skipped,
		up:            desc("vm_up", "Whether the VM's QEMU answered QMP (1) or not (0).", vm...),
		info:          desc("vm_info", "The VM's state as vmsup sees it; always 1.", "vm", "state"),
		scrapeVMs:     desc("scrape_vms", "Number of VMs reported in this scrape."),
		diskStalled:   desc("vm_disk_io_stalled", "1 when requests to the disk are in flight and none has ended for 5 s (storage unreachable?); 0 otherwise.", "vm", "disk"),
		scrapeSkipped: desc("scrape_skipped", "VMs left out of this scrape because they were starting or stopping; always 1.", "vm", "reason"),
		perVM: []vmMetric{
			vmm("vm_start_time_seconds", prometheus.GaugeValue, "Start time of the VM's QEMU process since unix epoch in seconds.",
				func(v *VM) (float64, bool) {
					if v.StartTime == nil {
						return 0, false
					}
					return float64(v.StartTime.UnixNano()) / 1e9, true
				}),
			vmm("vm_cpu_seconds_total", prometheus.CounterValue, "Host CPU time used by the VM's unit (cgroup cpu.stat usage) in seconds.",
				always(func(v *VM) float64 { return v.CPU.UsageSeconds })),
			vmm("vm_cpu_user_seconds_total", prometheus.CounterValue, "Host CPU time used by the VM's unit in user mode in seconds.",
				always(func(v *VM) float64 { return v.CPU.UserSeconds })),
			vmm("vm_cpu_system_seconds_total", prometheus.CounterValue, "Host CPU time used by the VM's unit in kernel mode in seconds.",
				always(func(v *VM) float64 { return v.CPU.SystemSeconds })),
			vmm("vm_cpu_delay_seconds_total", prometheus.CounterValue, "Time QEMU's threads waited on a host runqueue in seconds (host view of guest steal).",
				always(func(v *VM) float64 { return v.CPU.DelaySeconds })),
			vmm("vm_vcpus", prometheus.GaugeValue, "Number of virtual CPUs.",
				func(v *VM) (float64, bool) { return float64(v.CPU.VCPUs), v.CPU.VCPUs > 0 }),
			vmm("vm_memory_rss_bytes", prometheus.GaugeValue, "Memory charged to the VM's unit (cgroup memory.current) in bytes.",
				always(func(v *VM) float64 { return float64(v.Memory.RSSBytes) })),
			vmm("vm_balloon_actual_bytes", prometheus.GaugeValue, "Memory the balloon leaves to the guest in bytes; absent without a balloon.",
				func(v *VM) (float64, bool) { return known(v.Memory.BalloonActualBytes) }),
			vmm("vm_guest_memory_total_bytes", prometheus.GaugeValue, "Guest total memory from virtio-balloon statistics in bytes; absent when unknown.",
				func(v *VM) (float64, bool) { return known(v.Memory.GuestTotalBytes) }),
			vmm("vm_guest_memory_free_bytes", prometheus.GaugeValue, "Guest free memory from virtio-balloon statistics in bytes; absent when unknown.",
				func(v *VM) (float64, bool) { return known(v.Memory.GuestFreeBytes) }),
			vmm("vm_guest_memory_available_bytes", prometheus.GaugeValue, "Guest available memory from virtio-balloon statistics in bytes; absent when unknown.",
				func(v *VM) (float64, bool) { return known(v.Memory.GuestAvailableBytes) }),
		},
		perDisk: []diskMetric{
			disk("read_bytes_total", "Bytes read from the disk by the guest.", func(d *Disk) float64 { return float64(d.ReadBytes) }),
			disk("write_bytes_total", "Bytes written to the disk by the guest.", func(d *Disk) float64 { return float64(d.WriteBytes) }),
			disk("read_ops_total", "Read operations on the disk.", func(d *Disk) float64 { return float64(d.ReadOps) }),
			disk("write_ops_total", "Write operations on the disk.", func(d *Disk) float64 { return float64(d.WriteOps) }),
			disk("flush_ops_total", "Flush operations on the disk.", func(d *Disk) float64 { return float64(d.FlushOps) }),
			disk("read_time_seconds_total", "Time spent on reads from the disk in seconds.", func(d *Disk) float64 { return d.ReadTimeSeconds }),
			disk("write_time_seconds_total", "Time spent on writes to the disk in seconds.", func(d *Disk) float64 { return d.WriteTimeSeconds }),
			disk("flush_time_seconds_total", "Time spent on flushes of the disk in seconds.", func(d *Disk) float64 { return d.FlushTimeSeconds }),
		},
		perNIC: []nicMetric{
			nic("receive_bytes_total", "Bytes received by the guest (sent by the host tap).", func(n *NIC) float64 { return float64(n.RxBytes) }),
			nic("transmit_bytes_total", "Bytes sent by the guest (received by the host tap).", func(n *NIC) float64 { return float64(n.TxBytes) }),
			nic("receive_packets_total", "Packets received by the guest.", func(n *NIC) float64 { return float64(n.RxPackets) }),
			nic("transmit_packets_total", "Packets sent by the guest.", func(n *NIC) float64 { return float64(n.TxPackets) }),
			nic("receive_drops_total", "Packets for the guest that the host tap dropped.", func(n *NIC) float64 { return float64(n.RxDropped) }),
			nic("transmit_drops_total", "Packets from the guest that the host tap dropped.", func(n *NIC) float64 { return float64(n.TxDropped) }),
		},
	}
}

// Describe sends every descriptor, so the pedantic registry can check
// each collected series against them.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.info, c.scrapeVMs, c.scrapeSkipped} {
		ch <- d
	}
	for _, m := range c.perVM {
		ch <- m.desc
	}
	for _, m := range c.perDisk {
		ch <- m.desc
	}
	ch <- c.diskStalled
	for _, m := range c.perNIC {
		ch <- m.desc
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	emit := func(d *prometheus.Desc, typ prometheus.ValueType, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, typ, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	emit(c.scrapeVMs, prometheus.GaugeValue, float64(len(c.vms)))
	for _, s := range c.skipped {
		emit(c.scrapeSkipped, prometheus.GaugeValue, 1, s.Name, s.Reason)
	}
	for i := range c.vms {
		vm := &c.vms[i]
		up := 0.0
		if vm.Up {
			up = 1
		}
		emit(c.up, prometheus.GaugeValue, up, vm.Name)
		emit(c.info, prometheus.GaugeValue, 1, vm.Name, vm.State)
		if !vm.Up {
			continue // what we have of a silent QEMU would be stale or zero
		}
		for _, m := range c.perVM {
			if v, ok := m.value(vm); ok {
				emit(m.desc, m.typ, v, vm.Name)
			}
		}
		for j := range vm.Disks {
			d := &vm.Disks[j]
			for _, m := range c.perDisk {
				emit(m.desc, prometheus.CounterValue, m.value(d), vm.Name, d.Name)
			}
			stalled := 0.0
			if d.Stalled {
				stalled = 1
			}
			emit(c.diskStalled, prometheus.GaugeValue, stalled, vm.Name, d.Name)
		}
		for j := range vm.NICs {
			n := &vm.NICs[j]
			for _, m := range c.perNIC {
				emit(m.desc, prometheus.CounterValue, m.value(n), vm.Name, n.Name)
			}
		}
	}
}
