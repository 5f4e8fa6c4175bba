package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func migrateReceiveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "migrate-receive",
		Short:  "Destination side of a migration: speaks the migration protocol on stdin/stdout (run by the source's transport)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				return sup.Receive(cmd.Context(), os.Stdin, os.Stdout)
			})
		},
	}
}
