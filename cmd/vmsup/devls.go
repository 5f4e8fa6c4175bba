package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func diskLsCmd(g *globals) *cobra.Command {
	return devLsCmd(g, "List a VM's disks (boot-time and hot-plugged) with their I/O limits", "  vmsup disk ls web",
		func(st supervisor.Status) any { return nonNil(st.Disks) },
		func(w io.Writer, st supervisor.Status) {
			fmt.Fprintln(w, "DISK\tTYPE\tFORMAT\tMODE\tLIMITS\tHOTPLUG\tSOURCE")
			for _, d := range st.Disks {
				src := d.Source
				if d.Image != "" && d.Image != d.Source {
					src += " (runs on " + d.Image + ")" // a snapshot's overlay
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.Type, dash(d.Format), mode(d.ReadOnly), dash(d.IOLimits), yes(d.Hotplugged), src)
			}
		})
}

func nicLsCmd(g *globals) *cobra.Command {
	return devLsCmd(g, "List a VM's NICs with their link state, MACs, taps, bridges and forwards", "  vmsup nic ls web",
		func(st supervisor.Status) any { return nonNil(st.NICs) },
		func(w io.Writer, st supervisor.Status) {
			fmt.Fprintln(w, "NIC\tTYPE\tLINK\tMAC\tTAP\tBRIDGE\tHOTPLUG\tFORWARDS")
			for _, n := range st.NICs {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Type, n.Link, n.MAC, dash(n.Tap), dash(n.Bridge), yes(n.Hotplug), dash(strings.Join(n.Forwards, ",")))
			}
		})
}

// devLsCmd is disk ls and nic ls: one VM's status, shown as a table or JSON.
func devLsCmd(g *globals, short, example string, asJSON func(supervisor.Status) any, table func(io.Writer, supervisor.Status)) *cobra.Command {
	return &cobra.Command{
		Use:     "ls NAME|FILE",
		Short:   short,
		Example: example,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				st, err := sup.Status(cmd.Context(), name)
				if err != nil {
					return err
				}
				if g.json {
					return g.out.object(asJSON(st), nil)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				table(w, st)
				return w.Flush()
			})
		},
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}

func mode(ro bool) string {
	if ro {
		return "ro"
	}
	return "rw"
}
