package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func stopPostCmd(g *globals) *cobra.Command {
	var unit string
	cmd := &cobra.Command{
		Use:    "stop-post NAME",
		Short:  "Network clean-up run by the VM's unit (ExecStopPost=); not for direct use",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				note, err := sup.StopPostHook(cmd.Context(), args[0], unit)
				fmt.Fprintf(cmd.OutOrStdout(), "vmsup stop-post %s: %s\n", args[0], note)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&unit, "unit", "", "the unit this hook belongs to: it acts only if that is the VM's current QEMU")
	return cmd
}

func stopHookCmd(g *globals) *cobra.Command {
	var unit string
	cmd := &cobra.Command{
		Use:    "stop-hook NAME",
		Short:  "Graceful stop run by the VM's unit (ExecStop=); not for direct use",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Getenv("MAINPID") == "" {
				// QEMU exited by itself (systemd runs ExecStop= then too):
				// nothing to stop, and no Supervisor (D-Bus, records) to set
				// up on every stop's critical path.
				fmt.Fprintf(cmd.OutOrStdout(), "vmsup stop-hook %s: %s\n", args[0], supervisor.StoppedAlready)
				return nil
			}
			return g.with(func(sup *supervisor.Supervisor) error {
				step, err := sup.StopHook(cmd.Context(), args[0], unit)
				fmt.Fprintf(cmd.OutOrStdout(), "vmsup stop-hook %s: %s\n", args[0], step)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&unit, "unit", "", "the unit this hook belongs to: it acts only if that is the VM's current QEMU")
	return cmd
}
