package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func qmpCmd(g *globals) *cobra.Command {
	var unsafe bool
	cmd := &cobra.Command{
		Use:   "qmp NAME JSON",
		Short: `Send one raw QMP command, e.g. vmsup qmp web '{"execute":"query-status"}'`,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				reply, err := sup.QMP(cmd.Context(), name, []byte(args[1]), unsafe)
				if len(reply) == 0 {
					return err
				}
				if g.json {
					g.out.object(struct {
						Name  string          `json:"name"`
						Reply json.RawMessage `json:"reply"`
					}{name, reply}, nil)
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(reply))
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&unsafe, "unsafe", false, "pass a command that takes QEMU outside its confinement or ends it (HMP other than info, migrate exec:, host paths, network chardevs, quit); it is logged like every command")
	cmd.Long = `Send one raw QMP command to the VM's QEMU and print the reply.

Commands that would take QEMU outside its confinement (HMP other than "info",
migrate "exec:", a chardev on a network socket, any host path outside the VM's
state directory) or end it ("quit": use vmsup down) are refused unless --unsafe.
Every command, passed or refused, is logged in ROOT/records/NAME/qmp.log and
to the systemd journal.`
	return cmd
}
