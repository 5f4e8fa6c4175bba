package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// exitError ends the CLI with a code and no message (the guest command's).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func execCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "exec NAME|FILE -- CMD [ARG...]",
		Short: "Run a command in the guest through its agent; prints its output and exits with its code",
		Example: "  vmsup exec web -- cat /etc/os-release\n" +
			"  vmsup exec --timeout 5m web -- /usr/local/bin/backup",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return usageError{fmt.Errorf("exec: write the command after --: vmsup exec NAME -- CMD")}
			}
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				r, err := sup.Exec(cmd.Context(), name, args[1:], timeout)
				if err != nil {
					return err
				}
				if g.json {
					g.out.object(struct {
						Name      string `json:"name"`
						ExitCode  int    `json:"exit_code"`
						Signal    int    `json:"signal"`
						Stdout    string `json:"stdout"`
						Stderr    string `json:"stderr"`
						Truncated bool   `json:"truncated"`
					}{name, r.ExitCode, r.Signal, string(r.Stdout), string(r.Stderr), r.Truncated}, nil)
					if r.ExitCode != 0 {
						return exitError{r.ExitCode}
					}
					return nil
				}
				cmd.OutOrStdout().Write(r.Stdout)
				cmd.ErrOrStderr().Write(r.Stderr)
				if r.Truncated {
					fmt.Fprintln(cmd.ErrOrStderr(), "vmsup: output truncated by the guest agent (16 MiB each)")
				}
				if r.ExitCode != 0 {
					return exitError{r.ExitCode}
				}
				return nil
			})
		},
	}
	c.Flags().DurationVar(&timeout, "timeout", supervisor.DefaultExecTimeout, "how long the command may run")
	return c
}

func cpCmd(g *globals) *cobra.Command {
	var o supervisor.CopyOptions
	c := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file to or from a guest through its agent; one side is NAME:PATH (- is stdin/stdout)",
		Example: "  vmsup cp ./app.conf web:/etc/app.conf\n" +
			"  vmsup cp web:/var/log/app.log ./app.log",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcVM, srcPath, srcIn := guestPath(args[0])
			dstVM, dstPath, dstIn := guestPath(args[1])
			if srcIn == dstIn {
				return usageError{fmt.Errorf("cp: exactly one of SRC and DST must be NAME:PATH")}
			}
			if srcIn {
				return g.withVM(srcVM, func(sup *supervisor.Supervisor, name string) error {
					return copyOut(g, cmd, sup, name, srcPath, dstPath, o)
				})
			}
			return g.withVM(dstVM, func(sup *supervisor.Supervisor, name string) error {
				var r io.Reader = cmd.InOrStdin()
				if srcPath != "-" {
					f, err := os.Open(srcPath)
					if err != nil {
						return err
					}
					defer f.Close()
					r = f
				}
				n, err := sup.CopyToGuest(cmd.Context(), name, r, dstPath, o)
				if err == nil {
					copied(g, cmd, name, srcPath, name+":"+dstPath, n)
				}
				return err
			})
		},
	}
	c.Flags().Int64Var(&o.Max, "max", supervisor.DefaultCopyMax, "refuse to copy more than this many bytes")
	c.Flags().DurationVar(&o.Timeout, "timeout", supervisor.DefaultCopyTimeout, "how long the copy may take")
	return c
}

// copyOut copies the guest's file to dst through a temporary file beside
// it, renamed into place once complete: a failed copy leaves no half file.
func copyOut(g *globals, cmd *cobra.Command, sup *supervisor.Supervisor, name, src, dst string, o supervisor.CopyOptions) error {
	if dst == "-" {
		if g.json {
			return usageError{fmt.Errorf("cp: --json and a copy to stdout (-) do not mix")}
		}
		_, err := sup.CopyFromGuest(cmd.Context(), name, src, cmd.OutOrStdout(), o)
		return err
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, filepath.Base(src))
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".vmsup-cp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := sup.CopyFromGuest(cmd.Context(), name, src, tmp, o)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	copied(g, cmd, name, name+":"+src, dst, n)
	return nil
}

// copied reports a finished copy: a line on stderr, or cp's JSON.
func copied(g *globals, cmd *cobra.Command, name, src, dst string, n int64) {
	if !g.json {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s -> %s: %d bytes\n", src, dst, n)
		return
	}
	g.out.object(struct {
		Name        string `json:"name"`
		Source      string `json:"source"`
		Destination string `json:"destination"`
		Bytes       int64  `json:"bytes"`
	}{name, src, dst, n}, nil)
}

// guestPath splits "NAME:PATH"; a local path has no colon before its first
// slash.
func guestPath(arg string) (vm, path string, inGuest bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.ContainsRune(arg[:i], '/') {
		return "", arg, false
	}
	return arg[:i], arg[i+1:], true
}
