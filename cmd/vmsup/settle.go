package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func settleCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "settle NAME",
		Short:  "Settle an operation whose vmsup died (run by its guardian unit); not for direct use",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				note, err := sup.Settle(cmd.Context(), args[0])
				if note != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", args[0], note)
				}
				return err
			})
		},
	}
}

func rebootApplyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    supervisor.HookRebootApply + " NAME",
		Short:  "Start a VM again after its guest rebooted, with its pending changes (run by its guardian unit); not for direct use",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				note, err := sup.RebootApply(cmd.Context(), args[0])
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", args[0], note)
				return err
			})
		},
	}
}
