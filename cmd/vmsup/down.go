package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func downCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "down NAME|FILE...",
		Short: "Shut VMs down: ACPI powerdown, wait stop_timeout, then QMP quit, then kill",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				failed := 0
				for _, a := range args {
					name, err := vmName(a)
					if err == nil {
						var r supervisor.DownResult
						r, err = sup.Down(cmd.Context(), name)
						if err == nil {
							msg := map[supervisor.StopStep]string{
								supervisor.StoppedAlready: "already shut off",
								supervisor.StoppedACPI:    "guest powered off (ACPI)",
								supervisor.StoppedAgent:   "guest powered off (guest agent)",
								supervisor.StoppedQuit:    "QEMU quit after the stop timeout",
								supervisor.StoppedKill:    "QEMU killed",
							}[r.Step]
							if r.Note != "" {
								msg += "; " + r.Note
							}
							fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (%s)\n", name, msg, r.Duration.Round(time.Millisecond))
						}
					}
					if err != nil {
						failed++
						if len(args) == 1 {
							return err
						}
						fmt.Fprintln(os.Stderr, "vmsup:", err)
					}
				}
				if failed > 0 {
					return fmt.Errorf("%d of %d VMs did not go down", failed, len(args))
				}
				return nil
			})
		},
	}
}
