package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func lsCmd(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls",
		Short: "List VMs with their state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				sts, err := sup.List(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, sts)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tSTATE\tACCEL\tCPUS\tMEMORY\tPID\tBOOT")
				for _, s := range sts {
					state := string(s.State)
					if s.Reason != "" {
						state += " (" + s.Reason + ")"
					}
					boot := "-"
					if s.Autostart {
						boot = "enabled"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Name, state, s.Accel, s.CPUs, s.Memory, pid(s.MainPID), boot)
				}
				return w.Flush()
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func pid(p uint32) string {
	if p == 0 {
		return "-"
	}
	return fmt.Sprint(p)
}
