package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/supervisor"
)

func validateCmd(g *globals) *cobra.Command {
	var origins bool
	c := &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check FILEs (syntax, fields, referenced files, host limits) without starting anything",
		Long: "Check FILEs (syntax, fields, referenced files, host limits) without starting anything.\n" +
			"Every file is checked and every error of each is printed, in file order.",
		Example: "  vmsup validate web.toml db.toml",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				bad := 0
				var last error
				seen := map[string]string{}
				for _, p := range args {
					// A file with errors in fields is checked against the
					// host too: one run names every problem.
					f, err := loadFilePartial(sup, p)
					if f != nil {
						if prev, dup := seen[f.VM.Name]; dup && f.VM.Name != "" {
							err = f.Join(f.Err(), f.Errorf("name", "VM %q is also defined in %s", f.VM.Name, prev))
						} else {
							seen[f.VM.Name] = f.Path
							err = sup.ValidateContext(cmd.Context(), f)
						}
					}
					if err != nil {
						bad++
						last = err
						if len(args) == 1 && !g.json {
							return err // its lines, and nothing to sum up
						}
						if !g.json {
							printErr(cmd.ErrOrStderr(), err)
						}
						name := ""
						if f != nil {
							name = f.VM.Name
						}
						g.out.action(actionJSON{Name: name, File: p, Action: "invalid", Error: toErrorJSON(err)}, "")
						continue
					}
					g.out.action(actionJSON{Name: f.VM.Name, File: p, Action: "valid"}, fmt.Sprintf("%s: ok (vm %q)", f.Path, f.VM.Name))
					if origins && !g.json {
						for _, l := range f.OriginLines() {
							fmt.Fprintln(cmd.OutOrStdout(), "  "+l)
						}
					}
				}
				switch {
				case bad == 0:
				case len(args) == 1:
					return last
				default:
					return fmt.Errorf("%d of %d files have errors", bad, len(args))
				}
				return nil
			})
		},
	}
	c.Flags().BoolVar(&origins, "origins", false, "also list every value with the file and line it came from (a file with include = [...])")
	return c
}

// printErr writes each line of err as its own "vmsup: " line.
func printErr(w io.Writer, err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintln(w, "vmsup:", line)
	}
}
