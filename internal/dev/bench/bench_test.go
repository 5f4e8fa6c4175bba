package bench

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", []float64{7}, Summary{N: 1, Min: 7, Median: 7, Max: 7, P99: 7}},
		{"odd unsorted", []float64{5, 1, 3}, Summary{N: 3, Min: 1, Median: 3, Max: 5, P99: 5}},
		{"even takes the mean of the middle two", []float64{4, 1, 3, 2}, Summary{N: 4, Min: 1, Median: 2.5, Max: 4, P99: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			if d := cmp.Diff(tc.want, Summarize(tc.in)); d != "" {
				t.Errorf("Summarize(%v) (-want +got):\n%s", tc.in, d)
			}
			if d := cmp.Diff(in, tc.in); d != "" {
				t.Errorf("Summarize changed its input:\n%s", d)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	v := make([]float64, 200)
	for i := range v {
		v[i] = float64(200 - i) // 200..1, reversed
	}
	for _, tc := range []struct{ p, want float64 }{{50, 100}, {99, 198}, {100, 200}, {0.1, 1}} {
		if got := Percentile(v, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
}

func TestMillisAndRatio(t *testing.T) {
	if d := cmp.Diff([]float64{1.5, 1000}, Millis([]time.Duration{1500 * time.Microsecond, time.Second})); d != "" {
		t.Error(d)
	}
	if Ratio(3, 0) != 0 || Ratio(3, 2) != 1.5 {
		t.Errorf("Ratio: got %v and %v", Ratio(3, 0), Ratio(3, 2))
	}
}

func sampleReport() *Report {
	r := &Report{Machine: Machine{Date: "2026-11-30T06:00:00Z", Cores: 2, KVM: "PVM", QEMU: "QEMU 7.2"}}
	r.Add(Row{Section: "1. start", Figure: "start", Variant: "raw", Accel: "kvm", Unit: "ms", Summary: Summarize([]float64{100, 90, 110})})
	r.Add(Row{Section: "1. start", Figure: "start", Variant: "vmsup", Accel: "kvm", Unit: "ms",
		Summary: Summarize([]float64{120, 100, 110}), Baseline: "raw", Target: 1.20})
	r.Add(Row{Section: "1. start", Figure: "start", Variant: "slow", Accel: "kvm", Unit: "ms",
		Summary: Summarize([]float64{200}), Baseline: "raw", Target: 1.10, Failures: 1, Note: "one failed"})
	r.Add(Row{Section: "1. start", Figure: "stop", Variant: "orphan", Accel: "kvm", Unit: "ms",
		Summary: Summarize([]float64{5}), Baseline: "raw"}) // no raw row for this figure
	r.Add(Row{Section: "6. qmp", Figure: "query-status", Variant: "raw", Accel: "kvm", Unit: "ms",
		Summary: Summarize([]float64{0.1, 0.2}), ShowP99: true})
	r.Note("a note with %d", 42)
	r.Resolve()
	return r
}

func TestResolve(t *testing.T) {
	r := sampleReport()
	vm, _ := r.Find("1. start", "start", "vmsup")
	if vm.Ratio != 1.1 || vm.Met == nil || !*vm.Met {
		t.Errorf("vmsup: ratio %v met %v, want 1.1 and met", vm.Ratio, vm.Met)
	}
	slow, _ := r.Find("1. start", "start", "slow")
	if slow.Ratio != 2 || slow.Met == nil || *slow.Met {
		t.Errorf("slow: ratio %v met %v, want 2 and missed", slow.Ratio, slow.Met)
	}
	orphan, _ := r.Find("1. start", "stop", "orphan")
	if orphan.Ratio != 0 || orphan.Met != nil {
		t.Errorf("a row whose baseline is missing got ratio %v met %v", orphan.Ratio, orphan.Met)
	}
	if _, ok := r.Find("1. start", "start", "nope"); ok {
		t.Error("Find found a variant that is not there")
	}
}

func TestMarkdown(t *testing.T) {
	md := sampleReport().Markdown()
	for _, want := range []string{
		"on 2 cores", "KVM: PVM", "#### 1. start", "#### 6. qmp",
		"| start | vmsup | kvm | 3 | 100 ms | 110 ms | 120 ms | 1.10x raw | <= 1.20x met | 0 |  |",
		"| start | slow | kvm | 1 | 200 ms | 200 ms | 200 ms | 2.00x raw | <= 1.10x MISSED | 1 | one failed |",
		"| start | raw | kvm | 3 | 90 ms | 100 ms | 110 ms | baseline |",
		"| query-status | raw | kvm | 2 | 0.10 ms | 0.15 ms | 0.20 ms | 0.20 ms |  |", // nothing refers to it
		"- a note with 42",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Only the QMP section has a p99 column.
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| figure") && strings.Contains(line, "p99") != strings.Contains(md[:strings.Index(md, line)], "#### 6. qmp") {
			t.Errorf("p99 column in the wrong section: %q", line)
		}
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	md, js, err := sampleReport().Write(dir, "2026-11-30")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(md); err != nil {
		t.Error(err)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Rows) != 5 || back.Rows[1].Ratio != 1.1 || back.Machine.Cores != 2 || back.Notes[0] != "a note with 42" {
		t.Errorf("JSON round trip lost data: %+v", back)
	}
}

func TestAgainst(t *testing.T) {
	row := func(fig, variant string, med float64) Row {
		return Row{Section: "1. start", Figure: fig, Variant: variant, Accel: "tcg", Unit: "ms", Summary: Summary{N: 1, Median: med}}
	}
	prev := &Report{Rows: []Row{row("start", "vmsup CLI", 100), row("start", "raw QEMU", 100)}}
	prev.Machine.Date = "2026-12-01T16:25:07Z"
	cur := &Report{Rows: []Row{row("start", "vmsup CLI", 115), row("start", "raw QEMU", 104), row("stop", "raw QEMU", 9)},
		Previous: prev, PreviousName: "bench/results/old.json"}
	md := cur.Markdown()
	for _, want := range []string{
		"#### against bench/results/old.json (run 2026-12-01T16:25:07Z)",
		"| 1. start | start | vmsup CLI | tcg | 100 ms | 115 ms | +15% | worse > 10% |",
		"| 1. start | start | raw QEMU | tcg | 100 ms | 104 ms | +4% |  |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| 1. start | stop |") {
		t.Errorf("a row the previous run lacks is compared:\n%s", md)
	}
	dir := t.TempDir()
	_, js, err := cur.Write(dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	back, err := Load(js)
	if err != nil || len(back.Rows) != 3 || back.PreviousName != "bench/results/old.json" {
		t.Fatalf("Load = %+v, %v", back, err)
	}
}

// A baseline that failed makes the run fail: its ratios mean nothing.
func TestBrokenBaselines(t *testing.T) {
	r := &Report{}
	r.Add(Row{Section: "1. start", Figure: "f", Variant: "raw", Summary: Summarize([]float64{100}), Failures: 2, Note: "first failure: cgroup"})
	r.Add(Row{Section: "1. start", Figure: "f", Variant: "vmsup", Summary: Summarize([]float64{120}), Baseline: "raw"})
	r.Add(Row{Section: "1. start", Figure: "f", Variant: "cli", Summary: Summarize([]float64{130}), Baseline: "raw"})
	r.Add(Row{Section: "2. stop", Figure: "g", Variant: "vmsup", Summary: Summarize([]float64{1}), Baseline: "unit"})
	r.Add(Row{Section: "3. mem", Figure: "h", Variant: "a", Summary: Summarize([]float64{1})})
	r.Add(Row{Section: "3. mem", Figure: "h", Variant: "b", Summary: Summarize([]float64{1}), Baseline: "a"})
	got := r.BrokenBaselines()
	want := []string{"1. start / f / raw: 2 failed (first failure: cgroup)", "2. stop / g / unit: missing"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("BrokenBaselines = %q, want %q", got, want)
	}
}
