// Package bench holds the statistics and the report format of vmsup's
// side-by-side benchmark (cmd/vmsup-bench): summaries of repeated
// measurements (min / median / max, percentiles), ratios to a baseline, and
// the table rendered as Markdown and JSON.
//
// It does not run anything: starting VMs, libvirt and systemd is the
// benchmark program's job. It keeps no package-level state.
package bench

import (
	"math"
	"slices"
	"time"
)

// Summary condenses one variant's repeated measurements.
type Summary struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	P99    float64 `json:"p99,omitempty"` // filled by Summarize; shown for latency rows
}

// Summarize returns the summary of values (in any unit). An empty input
// gives the zero Summary. The median of an even count is the mean of the two
// middle values; P99 is the nearest-rank 99th percentile.
func Summarize(values []float64) Summary {
	if len(values) == 0 {
		return Summary{}
	}
	v := slices.Clone(values)
	slices.Sort(v)
	n := len(v)
	med := v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return Summary{N: n, Min: v[0], Median: med, Max: v[n-1], P99: Percentile(v, 99)}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// values; 0 for an empty input.
func Percentile(values []float64, p float64) float64 {
	if len(values) == 0 {
		return 0
	}
	v := slices.Clone(values)
	slices.Sort(v)
	rank := int(math.Ceil(p / 100 * float64(len(v))))
	rank = max(1, min(rank, len(v)))
	return v[rank-1]
}

// Millis converts durations to float milliseconds.
func Millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// Ratio is a/b, or 0 when b is 0 (no baseline).
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
