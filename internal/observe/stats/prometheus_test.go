package stats

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// sampleVMs is out of order on purpose: the output must not be.
func sampleVMs() []VM {
	start, start2 := time.Unix(1700000000, 500_000_000), time.Unix(1700000100, 0)
	return []VM{
		{
			Name: "web", State: "running", Up: true,
			StartTime: &start, Uptime: 3600,
			CPU:    CPU{UsageSeconds: 12.5, UserSeconds: 10, SystemSeconds: 2.5, DelaySeconds: 0.25, VCPUs: 2},
			Memory: Memory{RSSBytes: 1 << 30, BalloonActualBytes: 2 << 30, GuestTotalBytes: 2000000000, GuestFreeBytes: 1000000000, GuestAvailableBytes: 1500000000},
			Disks: []Disk{
				{Name: "vdb", ReadBytes: 4096, WriteBytes: 8192, ReadOps: 1, WriteOps: 2, FlushOps: 3, ReadTimeSeconds: 0.001, WriteTimeSeconds: 0.002, FlushTimeSeconds: 0.003},
				{Name: "vda", ReadBytes: 1 << 20, WriteBytes: 2 << 20, ReadOps: 10, WriteOps: 20, FlushOps: 5, ReadTimeSeconds: 1.5, WriteTimeSeconds: 2.5, FlushTimeSeconds: 0.5},
			},
			NICs: []NIC{{Name: "net0", HostIf: "vmtap-web0", RxBytes: 1000, TxBytes: 2000, RxPackets: 10, TxPackets: 20, RxDropped: 1, TxDropped: 2}},
		},
		{Name: "old", State: "failed"},
		{
			Name: "db", State: "running", Up: true,
			StartTime: &start2,
			CPU:       CPU{UsageSeconds: 1, UserSeconds: 0.5, SystemSeconds: 0.5, VCPUs: 1},
			Memory:    Memory{RSSBytes: 512 << 20},
			Disks:     []Disk{{Name: "vda", ReadBytes: 7}},
		},
	}
}

func render(t *testing.T, vms []VM, skipped []Skipped) string {
	t.Helper()
	var buf bytes.Buffer
	if err := WritePrometheus(&buf, vms, skipped); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func TestWritePrometheusText(t *testing.T) {
	out := render(t, sampleVMs(), []Skipped{{Name: "new", Reason: "starting"}})
	t.Log("\n" + out)
	for _, want := range []string{
		"# HELP vmsup_vm_up Whether the VM's QEMU answered QMP (1) or not (0).\n# TYPE vmsup_vm_up gauge\n" +
			"vmsup_vm_up{vm=\"db\"} 1\nvmsup_vm_up{vm=\"old\"} 0\nvmsup_vm_up{vm=\"web\"} 1\n",
		"# TYPE vmsup_vm_info gauge\nvmsup_vm_info{state=\"running\",vm=\"db\"} 1\nvmsup_vm_info{state=\"failed\",vm=\"old\"} 1\n",
		"# TYPE vmsup_vm_cpu_seconds_total counter\nvmsup_vm_cpu_seconds_total{vm=\"db\"} 1\nvmsup_vm_cpu_seconds_total{vm=\"web\"} 12.5\n",
		"vmsup_vm_start_time_seconds{vm=\"web\"} 1.7000000005e+09\n",
		// by vm, then disk, though the label names sort disk first
		"vmsup_vm_disk_read_bytes_total{disk=\"vda\",vm=\"db\"} 7\n" +
			"vmsup_vm_disk_read_bytes_total{disk=\"vda\",vm=\"web\"} 1.048576e+06\n" +
			"vmsup_vm_disk_read_bytes_total{disk=\"vdb\",vm=\"web\"} 4096\n",
		"vmsup_vm_disk_flush_time_seconds_total{disk=\"vda\",vm=\"web\"} 0.5\n",
		"vmsup_vm_nic_receive_bytes_total{nic=\"net0\",vm=\"web\"} 1000\n",
		"vmsup_vm_nic_transmit_drops_total{nic=\"net0\",vm=\"web\"} 2\n",
		"# TYPE vmsup_scrape_vms gauge\nvmsup_scrape_vms 3\n",
		"vmsup_scrape_skipped{reason=\"starting\",vm=\"new\"} 1\n",
		"vmsup_vm_guest_memory_total_bytes{vm=\"web\"} 2e+09\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks\n%s", want)
		}
	}
	// A VM that is not up has only up and info; unknown guest memory and
	// a missing balloon are absent, not 0.
	for line := range strings.SplitSeq(out, "\n") {
		if strings.Contains(line, `vm="old"`) && !strings.HasPrefix(line, "vmsup_vm_up{") && !strings.HasPrefix(line, "vmsup_vm_info{") {
			t.Errorf("down VM has %q", line)
		}
		if strings.Contains(line, `vm="db"`) && (strings.HasPrefix(line, "vmsup_vm_guest_") || strings.HasPrefix(line, "vmsup_vm_balloon_")) {
			t.Errorf("unknown value exported: %q", line)
		}
	}
}

func TestWritePrometheusDeterministic(t *testing.T) {
	vms := sampleVMs()
	want := render(t, vms, nil)
	slices.Reverse(vms)
	for i := range vms {
		slices.Reverse(vms[i].Disks)
	}
	if got := render(t, vms, nil); got != want {
		t.Errorf("output depends on input order:\n%s\nvs\n%s", got, want)
	}
}

func TestWritePrometheusParsesBack(t *testing.T) {
	out := render(t, sampleVMs(), []Skipped{{Name: "new", Reason: "starting"}, {Name: "gone", Reason: "stopping"}})
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	value := func(name string, labels map[string]string) (float64, dto.MetricType) {
		t.Helper()
		mf := families[name]
		if mf == nil {
			t.Fatalf("no family %s", name)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s has no HELP", name)
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), mf.GetType()
			default:
				return m.GetGauge().GetValue(), mf.GetType()
			}
		}
		t.Fatalf("%s%v not found", name, labels)
		return 0, 0
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
		typ    dto.MetricType
	}{
		{"vmsup_vm_up", map[string]string{"vm": "old"}, 0, dto.MetricType_GAUGE},
		{"vmsup_vm_info", map[string]string{"vm": "old", "state": "failed"}, 1, dto.MetricType_GAUGE},
		{"vmsup_vm_start_time_seconds", map[string]string{"vm": "db"}, 1700000100, dto.MetricType_GAUGE},
		{"vmsup_vm_cpu_user_seconds_total", map[string]string{"vm": "web"}, 10, dto.MetricType_COUNTER},
		{"vmsup_vm_cpu_system_seconds_total", map[string]string{"vm": "web"}, 2.5, dto.MetricType_COUNTER},
		{"vmsup_vm_cpu_delay_seconds_total", map[string]string{"vm": "web"}, 0.25, dto.MetricType_COUNTER},
		{"vmsup_vm_vcpus", map[string]string{"vm": "web"}, 2, dto.MetricType_GAUGE},
		{"vmsup_vm_memory_rss_bytes", map[string]string{"vm": "db"}, 512 << 20, dto.MetricType_GAUGE},
		{"vmsup_vm_balloon_actual_bytes", map[string]string{"vm": "web"}, 2 << 30, dto.MetricType_GAUGE},
		{"vmsup_vm_guest_memory_available_bytes", map[string]string{"vm": "web"}, 1500000000, dto.MetricType_GAUGE},
		{"vmsup_vm_disk_write_ops_total", map[string]string{"vm": "web", "disk": "vdb"}, 2, dto.MetricType_COUNTER},
		{"vmsup_vm_disk_write_time_seconds_total", map[string]string{"vm": "web", "disk": "vda"}, 2.5, dto.MetricType_COUNTER},
		{"vmsup_vm_nic_transmit_packets_total", map[string]string{"vm": "web", "nic": "net0"}, 20, dto.MetricType_COUNTER},
		{"vmsup_vm_nic_receive_drops_total", map[string]string{"vm": "web", "nic": "net0"}, 1, dto.MetricType_COUNTER},
		{"vmsup_scrape_vms", map[string]string{}, 3, dto.MetricType_GAUGE},
		{"vmsup_scrape_skipped", map[string]string{"vm": "gone", "reason": "stopping"}, 1, dto.MetricType_GAUGE},
	} {
		got, typ := value(c.name, c.labels)
		if got != c.want || typ != c.typ {
			t.Errorf("%s%v = %v (%v), want %v (%v)", c.name, c.labels, got, typ, c.want, c.typ)
		}
	}
	for name, mf := range families {
		if mf.GetHelp() == "" {
			t.Errorf("%s has no HELP", name)
		}
		if strings.HasSuffix(name, "_total") != (mf.GetType() == dto.MetricType_COUNTER) {
			t.Errorf("%s is a %v", name, mf.GetType())
		}
	}
	if _, ok := families["vmsup_vm_guest_memory_total_bytes"]; !ok {
		t.Error("guest memory family missing")
	}
	if n := len(families["vmsup_vm_guest_memory_total_bytes"].GetMetric()); n != 1 {
		t.Errorf("guest memory total has %d series, want 1 (web only)", n)
	}
}

func TestWritePrometheusPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skipf("promtool not installed (Debian package prometheus): %v", err)
	}
	out := render(t, sampleVMs(), []Skipped{{Name: "new", Reason: "starting"}})
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(out)
	msg, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(msg)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, msg)
	}
}

func TestWritePrometheusEmpty(t *testing.T) {
	if out := render(t, nil, nil); out != "# HELP vmsup_scrape_vms Number of VMs reported in this scrape.\n# TYPE vmsup_scrape_vms gauge\nvmsup_scrape_vms 0\n" {
		t.Errorf("empty scrape:\n%s", out)
	}
}

func TestWritePrometheusDuplicate(t *testing.T) {
	var buf bytes.Buffer
	vms := []VM{{Name: "a", Up: true}, {Name: "a", Up: true}}
	if err := WritePrometheus(&buf, vms, nil); err == nil {
		t.Error("two VMs named a: no error")
	}
	if buf.Len() != 0 {
		t.Errorf("wrote %d bytes before failing", buf.Len())
	}
}

func TestJSONNames(t *testing.T) {
	data, err := json.Marshal(sampleVMs()[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"name"`, `"state"`, `"up"`, `"start_time"`, `"uptime_seconds"`, `"usage_seconds"`, `"delay_seconds"`,
		`"vcpus"`, `"rss_bytes"`, `"balloon_actual_bytes"`, `"guest_available_bytes"`, `"read_time_seconds"`, `"flush_ops"`,
		`"host_if"`, `"rx_dropped"`, `"disks"`, `"nics"`} {
		if !bytes.Contains(data, []byte(key+":")) {
			t.Errorf("JSON lacks %s: %s", key, data)
		}
	}
	down, err := json.Marshal(VM{Name: "old", State: "failed"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(down, []byte(`"start_time":null`)) {
		t.Errorf("a VM not running has start_time null (keys never come and go): %s", down)
	}
}
