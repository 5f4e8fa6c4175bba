package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func enableCmd(g *globals) *cobra.Command {
	var now bool
	c := &cobra.Command{
		Use:   "enable FILE...",
		Short: "Start the VMs in FILEs at every boot (installs " + supervisor.BootUnitName + "); --now also brings them up",
		Long: `Marks each VM to start at boot from its file (edits to the file apply at the
next boot, as with vmsup up) and installs and enables the boot unit
` + supervisor.BootUnitName + `, which runs "vmsup autostart". Files are checked as up checks
them; nothing is marked if one is invalid. The VMs' own units stop gracefully
(ACPI powerdown) when the host shuts down.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withFiles(args, func(sup *supervisor.Supervisor, fs []*spec.File) error {
				res, err := sup.Enable(cmd.Context(), fs...)
				for _, r := range res {
					line := fmt.Sprintf("%s: enabled (starts at boot from %s)", r.VM, r.File)
					if r.Note != "" {
						line += "; " + r.Note
					}
					g.out.action(actionJSON{Name: r.VM, File: r.File, Action: "enabled", Note: r.Note}, line)
				}
				if err != nil || !now {
					return err
				}
				return printUp(g, cmd, sup, fs, false, false)
			})
		},
	}
	c.Flags().BoolVar(&now, "now", false, "also bring the VMs up now")
	return c
}

func disableCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "disable NAME|FILE...",
		Short: "Stop starting VMs at boot (they keep running; the boot unit goes when no VM is left enabled)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVMs(args, func(sup *supervisor.Supervisor, names []string) error {
				if err := sup.Disable(cmd.Context(), names...); err != nil {
					return err
				}
				for i, n := range names {
					g.out.action(actionJSON{Name: n, File: fileOf(args[i]), Action: "disabled"}, n+": disabled")
				}
				return nil
			})
		},
	}
}
