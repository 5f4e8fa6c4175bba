package main

import (
	"cmp"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func autostartCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "autostart",
		Short: "Bring up the VMs enabled for boot, each once per boot (what " + supervisor.BootUnitName + " runs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				res, err := sup.Autostart(cmd.Context())
				for _, r := range res {
					what := string(r.Action)
					if what == "" {
						what = "not started"
					}
					line := fmt.Sprintf("%s: %s (%s)", r.VM, what, r.File)
					if r.Note != "" {
						line += "; " + r.Note
					}
					g.out.action(actionJSON{Name: r.VM, File: r.File, Action: cmp.Or(string(r.Action), "not-started"), Note: r.Note}, line)
				}
				if len(res) == 0 && err == nil && !g.json {
					fmt.Fprintln(cmd.OutOrStdout(), "no VM is enabled for boot")
				}
				g.out.acting = true
				return err
			})
		},
	}
}
