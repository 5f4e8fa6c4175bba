package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/ops/qmppolicy"
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
	cmd.Flags().BoolVar(&unsafe, "unsafe", false, "pass a command that is not on the allow-list (it may take QEMU outside its confinement or end it); it is logged in qmp-security.log")
	cmd.Long = `Send one raw QMP command to the VM's QEMU and print the reply.

Without --unsafe only commands on the allow-list pass: QEMU's read-only
queries and the commands vmsup's own operations send, with their arguments
checked: host paths only in the VM's state directory (relative ones resolved
against QEMU's working directory, which is that directory), unix sockets only
there, no network address, no program, no file descriptor, no writable
export. Anything else is refused in one line naming the command and why.
The list (docs/qmp-policy.md has each command's checks):

` + qmppolicy.Summary() + `
Every command is logged in ROOT/records/NAME/qmp.log and to the systemd
journal; refused and --unsafe ones also in ROOT/records/NAME/qmp-security.log,
which ordinary commands never write. Entries are bounded (long strings
shortened, the size and SHA-256 of the whole kept); each log keeps one old
file, and a rotated log's first line says how many entries it has lost.`
	return cmd
}
