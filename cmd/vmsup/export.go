package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/supervisor"
)

// exportJSON is what `vmsup export --json` prints.
type exportJSON struct {
	Name   string `json:"name"`
	Output string `json:"output"` // "" when the file is in TOML
	TOML   string `json:"toml"`   // the VM file, without -o
}

func exportCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "export NAME [-o FILE]",
		Short: "Write the VM file of a VM as it runs (moved disks, applied changes, live vCPUs and memory)",
		Long: "Write the VM file of a VM as it runs now: what apply changed, its live vCPUs and memory,\n" +
			"and each disk where it is now (after disk moves). Disks and NICs attached by hand are\n" +
			"named in a comment, not in the file. Run the VM from it with vmsup up --adopt FILE.",
		Example: "  vmsup export web -o web.toml && vmsup plan --adopt web.toml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				b, err := sup.Export(name)
				if err != nil {
					return err
				}
				if out != "" {
					if err := atomicfile.WriteFile(out, b, 0o644); err != nil {
						return fmt.Errorf("export %s: %w", name, err)
					}
					return g.out.object(exportJSON{Name: name, Output: out}, func(w io.Writer) {
						fmt.Fprintf(w, "%s: written to %s\n", name, out)
					})
				}
				return g.out.object(exportJSON{Name: name, TOML: string(b)}, func(w io.Writer) { w.Write(b) })
			})
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "write the file here (replaced atomically) instead of to standard output")
	return c
}
