package main

import (
	"os"
	"os/signal"
	"syscall"

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
			// The source's end of the transport can vanish at any moment: a
			// write to it must fail (EPIPE), not kill this process before it
			// tears its QEMU down.
			signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP)
			return g.with(func(sup *supervisor.Supervisor) error {
				return sup.Receive(cmd.Context(), os.Stdin, os.Stdout)
			})
		},
	}
}
