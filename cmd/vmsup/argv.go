package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func argvCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "argv FILE",
		Short: "Print the exact QEMU argv for FILE, one argument per line",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withFiles(args, func(sup *supervisor.Supervisor, fs []*spec.File) error {
				argv, err := sup.Argv(fs[0])
				if err != nil {
					return err
				}
				return g.out.object(struct {
					Name string   `json:"name"`
					Argv []string `json:"argv"`
				}{fs[0].VM.Name, argv}, func(w io.Writer) {
					for _, a := range argv {
						fmt.Fprintln(w, a)
					}
				})
			})
		},
	}
}
