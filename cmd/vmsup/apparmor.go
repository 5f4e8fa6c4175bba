package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func profileCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "apparmor-profile FILE",
		Short: "Print the AppArmor profile vmsup loads for the VM in FILE (disks, backing chains, boot files)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withFiles(args, func(sup *supervisor.Supervisor, fs []*spec.File) error {
				p, err := sup.AppArmorProfile(cmd.Context(), fs[0])
				if err != nil {
					return err
				}
				text, err := p.Render()
				if err != nil {
					return err
				}
				return g.out.object(struct {
					Name    string `json:"name"`
					Profile string `json:"profile"`
				}{fs[0].VM.Name, string(text)}, func(w io.Writer) { w.Write(text) })
			})
		},
	}
}
