package main

import (
	"strings"

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
					left, err := sup.RemoveVM(cmd.Context(), n)
					if err != nil {
						return err
					}
					note := "its disk images are kept"
					if len(left) > 0 {
						note += "; its snapshots' overlays are kept too, and its disks' latest data is in them: " + strings.Join(left, ", ")
					}
					g.out.action(actionJSON{Name: n, File: fileOf(args[i]), Action: "removed", Note: note}, n+": removed ("+note+")")
				}
				return nil
			})
		},
	}
}
