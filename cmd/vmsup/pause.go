package main

import (
	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
)

func pauseCmd(g *globals) *cobra.Command { return stateCmd(g, "pause", "Pause a VM (QMP stop)") }

func resumeCmd(g *globals) *cobra.Command {
	return stateCmd(g, "resume", "Resume a paused VM (QMP cont)")
}

func stateCmd(g *globals, op, short string) *cobra.Command {
	return &cobra.Command{
		Use:   op + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				var err error
				if op == "pause" {
					err = sup.Pause(cmd.Context(), name)
				} else {
					err = sup.Resume(cmd.Context(), name)
				}
				if err == nil {
					state := map[string]string{"pause": "paused", "resume": "running"}[op]
					g.out.action(actionJSON{Name: name, File: fileOf(args[0]), Action: state, State: state}, name+": "+state)
				}
				return err
			})
		},
	}
}
