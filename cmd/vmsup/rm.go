package main

import (
	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func rmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME|FILE...",
		Short: "Forget VMs that are not running: state, records, autostart mark (disk images stay)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVMs(args, func(sup *supervisor.Supervisor, names []string) error {
				for i, n := range names {
					if err := sup.Remove(cmd.Context(), n); err != nil {
						return err
					}
					g.out.action(actionJSON{Name: n, File: fileOf(args[i]), Action: "removed", Note: "its disk images are kept"}, n+": removed (its disk images are kept)")
				}
				return nil
			})
		},
	}
}
