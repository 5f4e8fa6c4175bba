package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func logsCmd(g *globals) *cobra.Command {
	var (
		o     supervisor.LogOptions
		since string
	)
	c := &cobra.Command{
		Use:   "logs NAME|FILE",
		Short: "Show a VM's console log and its units' journal, merged (-f to follow)",
		Long: "Show a VM's console log and its units' journal, merged. Journal lines carry their time;\n" +
			"console lines the time they were written (kept beside the log, to within 0.1 s) and follow\n" +
			"the start of the QEMU that wrote them (with -f, new lines are shown as they come, with the\n" +
			"time they were seen). Console lines are shown without the guest's terminal control sequences\n" +
			"(colours, cursor moves, titles); the console log file (vmsup status) keeps them as written.",
		Example: "  vmsup logs web\n" +
			"  vmsup logs -f --since 10m web",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if since != "" {
				t, err := parseSince(since)
				if err != nil {
					return usageError{err}
				}
				o.Since = t
			}
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				out := cmd.OutOrStdout()
				return sup.Logs(cmd.Context(), name, o, func(l supervisor.LogLine) {
					if g.json {
						g.out.line(struct {
							Name   string     `json:"name"`
							Time   *time.Time `json:"time"`
							Source string     `json:"source"`
							Text   string     `json:"text"`
						}{name, timeOrNil(l.Time), l.Source, l.Text})
						return
					}
					ts := strings.Repeat(" ", 23)
					if !l.Time.IsZero() {
						ts = l.Time.Local().Format("2006-01-02T15:04:05.000")
					}
					src := "console"
					if l.Source != "console" {
						src = "journal"
					}
					fmt.Fprintf(out, "%s %-7s %s\n", ts, src, l.Text)
				})
			})
		},
	}
	c.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep showing new lines")
	c.Flags().StringVar(&since, "since", "", "only lines since then: a duration back (\"10m\") or a time (RFC 3339)")
	return c
}

// parseSince reads --since: "10m" (that long ago) or an RFC 3339 time.
func parseSince(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration (\"10m\") or an RFC 3339 time", s)
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
