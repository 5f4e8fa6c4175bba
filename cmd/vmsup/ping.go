package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func pingCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "ping NAME",
		Short: "Ping the guest agent (qemu-ga) in the VM; exits 1 when it does not answer",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				a, err := sup.GuestPing(cmd.Context(), name)
				if err != nil {
					return err
				}
				if g.json {
					if err := g.out.object(toAgentJSON(name, a), nil); err != nil {
						return err
					}
				} else if a.Responding {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", name, agentLine(a))
				}
				if !a.Responding {
					return fmt.Errorf("vm %q: guest agent: %s", name, a.Error)
				}
				return nil
			})
		},
	}
	return c
}
