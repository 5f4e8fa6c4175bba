package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func eventsCmd(g *globals) *cobra.Command {
	var (
		follow bool
		since  string
	)
	c := &cobra.Command{
		Use:   "events [NAME|FILE...]",
		Short: "Show VMs' events, QEMU's and vmsup's (history kept without a daemon; -f to follow)",
		Long: "Show VMs' events: QEMU's (SHUTDOWN, RESET, STOP, RESUME, GUEST_PANICKED, DEVICE_DELETED,\n" +
			"BLOCK_IO_ERROR, ...) and vmsup's (started, stopped with QEMU's reason, crashed with the signal,\n" +
			"applied). QEMU writes its events to a log with no client connected and vmsup keeps them, so\n" +
			"events are never lost while no vmsup runs; any number of readers can run at once. Without\n" +
			"NAME, every VM.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var from time.Time
			if since != "" {
				t, err := parseSince(since)
				if err != nil {
					return usageError{err}
				}
				from = t
			}
			return g.ops(func(sup remoteapi.Ops) error {
				names, err := eventVMs(sup, args)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				return sup.FollowEvents(cmd.Context(), names, from, follow, func(e supervisor.Event) error {
					if g.json {
						e.Data = nonNilMap(e.Data)
						g.out.line(e)
						return nil
					}
					line := fmt.Sprintf("%s %-10s %-6s %s", e.Time.Local().Format("2006-01-02T15:04:05.000"), e.VM, e.Source, e.Kind)
					if e.Reason != "" {
						line += " (" + e.Reason + ")"
					}
					if d := eventDetail(e); d != "" {
						line += " " + d
					}
					_, err := fmt.Fprintln(out, line)
					return err
				})
			})
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep showing new events")
	c.Flags().StringVar(&since, "since", "", "only events since then: a duration back (\"10m\") or a time (RFC 3339)")
	return c
}

// eventVMs are the named VMs, or every VM vmsup knows.
func eventVMs(sup remoteapi.Ops, args []string) ([]string, error) {
	if len(args) > 0 {
		return vmNames(args)
	}
	return sup.Names()
}

// eventDetail is the event's data other than its reason, compact.
func eventDetail(e supervisor.Event) string {
	var parts []string
	for k, v := range e.Data {
		if k == "reason" {
			continue
		}
		b, _ := json.Marshal(v)
		parts = append(parts, k+"="+string(b))
	}
	if len(parts) == 0 {
		return ""
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func nonNilMap(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}
