package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func lsCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "ls",
		Short: "List VMs with their state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.ops(func(sup remoteapi.Ops) error {
				sts, err := sup.List(cmd.Context())
				if err != nil {
					return err
				}
				if g.json {
					return g.out.object(nonNil(sts), nil)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tSTATE\tFILE\tSYNC\tIPV4\tIPV6\tCPUS\tMEMORY\tUPTIME\tPORTS\tBOOT\tPID")
				for _, s := range sts {
					state := string(s.State)
					if s.Reason != "" {
						state += " (" + s.Reason + ")"
					}
					boot := "-"
					if s.Autostart {
						boot = "enabled"
					}
					up := "-"
					if s.Since != nil && (s.State == supervisor.StateRunning || s.State == supervisor.StatePaused) {
						up = uptime(*s.Since)
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, state, dash(shortPath(s.SpecFile)), dash(s.Sync), ipv4s(s),
						dash(strings.Join(s.IPv6(), ", ")), s.CPUs, s.Memory, up, ports(s), boot, pid(s.MainPID))
				}
				return w.Flush()
			})
		},
	}
	return c
}

// shortPath is path relative to the working directory when it is below it
// (the VM's file, as the user named it), else path.
func shortPath(path string) string {
	wd, err := os.Getwd()
	if err != nil || path == "" {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}

func pid(p uint32) string {
	if p == 0 {
		return "-"
	}
	return fmt.Sprint(p)
}

// ipv4s are the guest's IPv4 addresses (its agent's, then those the host
// gave its NICs: Status.IPv4), or "-".
func ipv4s(s supervisor.Status) string { return dash(strings.Join(s.IPv4(), ", ")) }

// ports are the user NICs' host forwards, as "127.0.0.1:2222->22/tcp".
func ports(s supervisor.Status) string {
	var out []string
	for _, n := range s.NICs {
		for _, f := range n.Forwards {
			out = append(out, forwardShort(f))
		}
	}
	return dash(strings.Join(out, ", "))
}

// forwardShort renders "tcp:127.0.0.1:2222-:22" as docker does: "127.0.0.1:2222->22/tcp".
func forwardShort(f string) string {
	proto, rest, ok := strings.Cut(f, ":")
	host, guest, ok2 := strings.Cut(rest, "-")
	if !ok || !ok2 {
		return f
	}
	return host + "->" + strings.TrimPrefix(guest, ":") + "/" + proto
}
