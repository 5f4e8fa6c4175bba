package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func validateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check FILEs (syntax, fields, referenced files, host limits) without starting anything",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withFiles(args, func(sup *supervisor.Supervisor, fs []*spec.File) error {
				if err := sup.ValidateContext(cmd.Context(), fs...); err != nil {
					return err
				}
				for _, f := range fs {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (vm %q)\n", f.Path, f.VM.Name)
				}
				return nil
			})
		},
	}
}
