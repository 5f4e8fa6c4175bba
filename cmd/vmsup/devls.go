package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func diskLsCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:     "ls NAME|FILE",
		Short:   "List a VM's disks (boot-time and hot-plugged)",
		Example: "  vmsup disk ls web",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				st, err := sup.Status(cmd.Context(), name)
				if err != nil {
					return err
				}
				if g.json {
					return g.out.object(disksJSON(st.Disks), nil)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "DISK\tTYPE\tFORMAT\tMODE\tHOTPLUG\tSOURCE")
				for _, d := range st.Disks {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.Type, dash(d.Format), mode(d.ReadOnly), yes(d.Hotplugged), d.Source)
				}
				return w.Flush()
			})
		},
	}
	return c
}

func nicLsCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:     "ls NAME|FILE",
		Short:   "List a VM's NICs with their MACs, taps, bridges and forwards",
		Example: "  vmsup nic ls web",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				st, err := sup.Status(cmd.Context(), name)
				if err != nil {
					return err
				}
				if g.json {
					return g.out.object(nicsJSON(st.NICs), nil)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NIC\tTYPE\tMAC\tTAP\tBRIDGE\tHOTPLUG\tFORWARDS")
				for _, n := range st.NICs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Type, n.MAC, dash(n.Tap), dash(n.Bridge), yes(n.Hotplug), dash(strings.Join(n.Forwards, ",")))
				}
				return w.Flush()
			})
		},
	}
	return c
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
