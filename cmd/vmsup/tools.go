package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

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
				for _, a := range argv {
					fmt.Fprintln(cmd.OutOrStdout(), a)
				}
				return nil
			})
		},
	}
}

func validateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check FILEs (syntax, fields, referenced files, host limits) without starting anything",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withFiles(args, func(sup *supervisor.Supervisor, fs []*spec.File) error {
				if err := sup.Validate(fs...); err != nil {
					return err
				}
				for _, f := range fs {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (vm %q)\n", f.Path, f.VM.Name)
				}
				return nil
			})
		},
	}
}

func qmpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "qmp NAME JSON",
		Short: `Send one raw QMP command, e.g. vmsup qmp web '{"execute":"query-status"}'`,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				reply, err := sup.QMP(cmd.Context(), name, []byte(args[1]))
				if len(reply) > 0 {
					fmt.Fprintln(cmd.OutOrStdout(), string(reply))
				}
				return err
			})
		},
	}
}

// detachKey is Ctrl-] (as telnet and virsh console use).
const detachKey = 0x1d

func consoleCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "console NAME",
		Short: "Attach to the VM's serial console (detach with Ctrl-])",
		Long: "Attach to the VM's serial console socket. On a terminal, Ctrl-] detaches and leaves the VM running.\n" +
			"Without a terminal, stdin is sent to the console until it ends, and console output is copied to stdout.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				dctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
				conn, err := sup.DialConsole(dctx, name)
				cancel()
				if err != nil {
					return fmt.Errorf("%w (is it running?)", err)
				}
				defer conn.Close()
				return attach(cmd.Context(), conn, os.Stdin, cmd.OutOrStdout())
			})
		},
	}
}

func attach(ctx context.Context, conn net.Conn, in *os.File, out io.Writer) error {
	fd := int(in.Fd())
	isTTY := term.IsTerminal(fd)
	if isTTY {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return err
		}
		defer term.Restore(fd, old)
		fmt.Fprint(out, "Connected to the console; Ctrl-] detaches.\r\n")
	}
	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(out, conn)
		done <- err
	}()
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := in.Read(buf)
			for i := 0; i < n; i++ {
				if isTTY && buf[i] == detachKey {
					_, _ = conn.Write(buf[:i])
					done <- nil
					return
				}
			}
			if n > 0 {
				if _, werr := conn.Write(buf[:n]); werr != nil {
					done <- werr
					return
				}
			}
			if err != nil {
				// stdin ended: give the guest a moment to answer, then leave.
				time.Sleep(500 * time.Millisecond)
				done <- nil
				return
			}
		}
	}()
	select {
	case err := <-done:
		if isTTY {
			fmt.Fprint(out, "\r\nDetached.\r\n")
		}
		return err
	case <-ctx.Done():
		return nil
	}
}

func stopHookCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "stop-hook NAME",
		Short:  "Graceful stop run by the VM's unit (ExecStop=); not for direct use",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				step, err := sup.StopHook(cmd.Context(), args[0])
				fmt.Fprintf(cmd.OutOrStdout(), "vmsup stop-hook %s: %s\n", args[0], step)
				return err
			})
		},
	}
}

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
				_, err = cmd.OutOrStdout().Write(text)
				return err
			})
		},
	}
}

func pingCmd(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ping NAME",
		Short: "Ping the guest agent (qemu-ga) in the VM; exits 1 when it does not answer",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				a, err := sup.GuestPing(cmd.Context(), name)
				if err != nil {
					return err
				}
				if asJSON {
					if err := printJSON(cmd, a); err != nil {
						return err
					}
				} else if a.Responding {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", name, agentLine(a))
				}
				if !a.Responding {
					return fmt.Errorf("vm %q: guest agent: %s", name, a.Error)
				}
				return nil
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func agentLine(a supervisor.AgentStatus) string {
	if !a.Responding {
		return "not responding: " + a.Error
	}
	line := fmt.Sprintf("qemu-ga %s responding in %.1f ms", a.Version, a.PingMillis)
	if a.OS != "" {
		line += "; " + a.OS
	}
	return line
}
