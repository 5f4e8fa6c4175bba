package main

import (
	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func downCmd(g *globals) *cobra.Command {
	var o supervisor.DownOptions
	c := &cobra.Command{
		Use:   "down NAME|FILE...",
		Short: "Shut VMs down: ACPI powerdown, wait stop_timeout, then QMP quit, then kill",
		Example: "  vmsup down web\n" +
			"  vmsup down --timeout 10s web db\n" +
			"  vmsup down --force web   # QMP quit at once, no guest shutdown",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.ops(func(sup remoteapi.Ops) error {
				return eachVM(g, cmd, args, "down", func(a string) (actionJSON, string, error) {
					name, err := vmName(a)
					if err != nil {
						return actionJSON{}, "", err
					}
					oo := o
					oo.Waiting = waitingPrinter(cmd.ErrOrStderr(), name)
					r, err := sup.DownWith(cmd.Context(), name, oo)
					return downAction(r, a), downLine(r), err
				})
			})
		},
	}
	c.Flags().DurationVar(&o.Timeout, "timeout", 0, "how long the guest gets to power off (default: the VM's stop_timeout)")
	c.Flags().BoolVar(&o.Force, "force", false, "no guest shutdown: QMP quit at once (QEMU flushes its disks), kill if it does not exit")
	return c
}
