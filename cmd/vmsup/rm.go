package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func rmCmd(g *globals) *cobra.Command {
	var deleteDisks bool
	cmd := &cobra.Command{
		Use:   "rm NAME|FILE...",
		Short: "Forget VMs that are not running: state, records, autostart mark (disk images stay unless --delete-disks)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVMs(args, func(sup *supervisor.Supervisor, names []string) error {
				for i, n := range names {
					r, err := sup.RemoveDisks(cmd.Context(), n, deleteDisks)
					if err != nil {
						return err
					}
					var notes []string
					if len(r.Deleted) > 0 {
						notes = append(notes, "deleted the disk images vmsup made for it: "+strings.Join(r.Deleted, ", "))
					}
					if len(r.Kept) > 0 {
						note := "kept its disk images: " + strings.Join(r.Kept, ", ")
						if !deleteDisks {
							note += " (rm --delete-disks deletes the ones vmsup made; a VM of this name made again would find them)"
						}
						notes = append(notes, note)
					}
					if len(notes) == 0 {
						notes = append(notes, "it had no disk images")
					}
					note := strings.Join(notes, "; ")
					g.out.action(actionJSON{Name: n, File: fileOf(args[i]), Action: "removed", Note: note}, n+": removed ("+note+")")
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&deleteDisks, "delete-disks", false, "also delete the disk images vmsup made for the VM (at its first start, on a stored image, as a clone, its snapshots' overlays); never a user's, shared or read-only image")
	return cmd
}
