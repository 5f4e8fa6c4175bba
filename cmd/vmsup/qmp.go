package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func qmpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "qmp NAME JSON",
		Short: `Send one raw QMP command, e.g. vmsup qmp web '{"execute":"query-status"}'`,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				reply, err := sup.QMP(cmd.Context(), name, []byte(args[1]))
				if len(reply) > 0 {
					fmt.Fprintln(cmd.OutOrStdout(), string(reply))
				}
				return err
			})
		},
	}
}
