package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Machine records where a run happened, so figures are read against it.
type Machine struct {
	Date    string `json:"date"` // RFC 3339, UTC
	Cores   int    `json:"cores"`
	CPU     string `json:"cpu"`
	MemMiB  int64  `json:"mem_mib"`
	Kernel  string `json:"kernel"`
	KVM     string `json:"kvm"` // what /dev/kvm is here, e.g. PVM
	QEMU    string `json:"qemu"`
	Systemd string `json:"systemd"`
	Libvirt string `json:"libvirt"`
	Go      string `json:"go"`
}

// Row is one figure of one variant.
type Row struct {
	Section string `json:"section"` // "1. start", ...
	Figure  string `json:"figure"`  // what is measured, e.g. "start until QMP running"
	Variant string `json:"variant"`
	Accel   string `json:"accel"` // kvm, tcg or "-"
	Unit    string `json:"unit"`  // ms, MiB, count
	Summary
	ShowP99 bool `json:"-"`
	// Baseline names the variant of the same section and figure whose median
	// is the denominator of Ratio; Target, when > 0, is the highest ratio
	// that meets the goal.
	Baseline string  `json:"baseline,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Target   float64 `json:"target,omitempty"`
	// Limit, when > 0, is the highest median (in Unit) that meets the goal,
	// for a figure with an absolute target rather than a ratio.
	Limit    float64 `json:"limit,omitempty"`
	Met      *bool   `json:"met,omitempty"`
	Failures int     `json:"failures"`
	Note     string  `json:"note,omitempty"`
}

// Report is one benchmark run.
type Report struct {
	Machine Machine  `json:"machine"`
	Rows    []Row    `json:"rows"`
	Notes   []string `json:"notes,omitempty"`
	Took    string   `json:"took,omitempty"`
	// Previous, when set, is an earlier run (named PreviousName) whose medians
	// are shown beside this run's, so a change's cost is read off one table.
	Previous     *Report `json:"-"`
	PreviousName string  `json:"previous,omitempty"`
}

// Load reads a report written by Write (its .json file).
func Load(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// Worse is the relative change beyond which a figure counts as a regression.
const Worse = 0.10

// Against renders this run's medians beside the previous run's, for every row
// both have (same section, figure, variant and accel). Times and memory are
// better when lower; a rise of more than Worse is marked for a reason.
func (r *Report) Against() string {
	if r.Previous == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n#### against %s (run %s)\n\n", r.PreviousName, r.Previous.Machine.Date)
	b.WriteString("| section | figure | variant | accel | before | now | change | |\n|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		old, ok := r.Previous.Find(row.Section, row.Figure, row.Variant)
		if !ok || old.Accel != row.Accel || old.Median == 0 {
			continue
		}
		change := (row.Median - old.Median) / old.Median
		mark := ""
		if row.Unit != "count" && change > Worse {
			mark = "worse > 10%"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %+.0f%% | %s |\n", row.Section, row.Figure, row.Variant,
			row.Accel, num(old.Median, old.Unit), num(row.Median, row.Unit), 100*change, mark)
	}
	return b.String()
}

// Add appends a row.
func (r *Report) Add(row Row) { r.Rows = append(r.Rows, row) }

// Note appends a free-text note shown under the tables.
func (r *Report) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Resolve fills Ratio and Met of every row that names a baseline present in
// the same section and figure.
func (r *Report) Resolve() {
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Limit > 0 && row.N > 0 {
			met := row.Median <= row.Limit
			row.Met = &met
		}
		if row.Baseline == "" {
			continue
		}
		for _, b := range r.Rows {
			if b.Section == row.Section && b.Figure == row.Figure && b.Variant == row.Baseline {
				row.Ratio = Ratio(row.Median, b.Median)
				if row.Target > 0 && row.Ratio > 0 {
					met := row.Ratio <= row.Target
					row.Met = &met
				}
				break
			}
		}
	}
}

// BrokenBaselines names each row that another row measures against and
// that failed or has no sample: the ratios against it mean nothing, so a
// run with one is a failed run.
func (r *Report) BrokenBaselines() []string {
	var out []string
	seen := map[string]bool{}
	for _, row := range r.Rows {
		if row.Baseline == "" {
			continue
		}
		b, ok := r.Find(row.Section, row.Figure, row.Baseline)
		key := row.Section + " / " + row.Figure + " / " + row.Baseline
		if seen[key] || (ok && b.Failures == 0 && b.N > 0) {
			continue
		}
		seen[key] = true
		switch {
		case !ok:
			out = append(out, key+": missing")
		case b.N == 0:
			out = append(out, key+": no sample")
		default:
			out = append(out, fmt.Sprintf("%s: %d failed (%s)", key, b.Failures, b.Note))
		}
	}
	return out
}

// Find returns the row of a section, figure and variant.
func (r *Report) Find(section, figure, variant string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Section == section && row.Figure == figure && row.Variant == variant {
			return row, true
		}
	}
	return Row{}, false
}

// Markdown renders the machine, one table per section in order of first
// appearance, and the notes.
func (r *Report) Markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "Run %s on %d cores (%s), %d MiB RAM, kernel %s; KVM: %s; %s; systemd %s; libvirt %s; %s.",
		m.Date, m.Cores, m.CPU, m.MemMiB, m.Kernel, m.KVM, m.QEMU, m.Systemd, m.Libvirt, m.Go)
	if r.Took != "" {
		fmt.Fprintf(&b, " The run took %s.", r.Took)
	}
	b.WriteString("\n")
	var sections []string
	seen := map[string]bool{}
	for _, row := range r.Rows {
		if !seen[row.Section] {
			seen[row.Section] = true
			sections = append(sections, row.Section)
		}
	}
	// A row is shown as "baseline" only when another row is measured against it.
	base := map[[3]string]bool{}
	for _, row := range r.Rows {
		if row.Baseline != "" {
			base[[3]string{row.Section, row.Figure, row.Baseline}] = true
		}
	}
	for _, sec := range sections {
		fmt.Fprintf(&b, "\n#### %s\n\n", sec)
		p99 := false
		for _, row := range r.Rows {
			p99 = p99 || row.Section == sec && row.ShowP99
		}
		b.WriteString("| figure | variant | accel | n | min | median | max |")
		if p99 {
			b.WriteString(" p99 |")
		}
		b.WriteString(" ratio | target | fail | note |\n|---|---|---|---|---|---|---|")
		if p99 {
			b.WriteString("---|")
		}
		b.WriteString("---|---|---|---|\n")
		for _, row := range r.Rows {
			if row.Section != sec {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s |", row.Figure, row.Variant, row.Accel, row.N,
				num(row.Min, row.Unit), num(row.Median, row.Unit), num(row.Max, row.Unit))
			if p99 {
				if row.ShowP99 {
					fmt.Fprintf(&b, " %s |", num(row.P99, row.Unit))
				} else {
					b.WriteString(" |")
				}
			}
			fmt.Fprintf(&b, " %s | %s | %d | %s |\n", ratio(row, base[[3]string{row.Section, row.Figure, row.Variant}]),
				target(row), row.Failures, row.Note)
		}
	}
	b.WriteString(r.Against())
	if len(r.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

func num(v float64, unit string) string {
	switch unit {
	case "count":
		return fmt.Sprintf("%.0f", v)
	case "ms":
		if v < 10 {
			return fmt.Sprintf("%.2f ms", v)
		}
		return fmt.Sprintf("%.0f ms", v)
	case "s":
		return fmt.Sprintf("%.2f s", v)
	default:
		return fmt.Sprintf("%.1f %s", v, unit)
	}
}

func ratio(r Row, isBase bool) string {
	if isBase {
		return "baseline"
	}
	if r.Baseline == "" {
		return ""
	}
	if r.Ratio == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx %s", r.Ratio, r.Baseline)
}

func target(r Row) string {
	if r.Target == 0 && r.Limit == 0 {
		return ""
	}
	s := fmt.Sprintf("<= %.2fx", r.Target)
	if r.Limit > 0 {
		s = "<= " + num(r.Limit, r.Unit)
	}
	if r.Met != nil {
		if *r.Met {
			return s + " met"
		}
		return s + " MISSED"
	}
	return s
}

// Write stores the report as dir/NAME.md and dir/NAME.json and returns the
// two paths.
func (r *Report) Write(dir, name string) (md, js string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	md, js = filepath.Join(dir, name+".md"), filepath.Join(dir, name+".json")
	if err := os.WriteFile(md, []byte(r.Markdown()), 0o644); err != nil {
		return "", "", err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", "", err
	}
	return md, js, os.WriteFile(js, append(b, '\n'), 0o644)
}
