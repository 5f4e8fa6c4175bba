package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func loadFiles(paths []string) ([]*spec.File, error) {
	var fs []*spec.File
	for _, p := range paths {
		f, err := spec.Load(p)
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
	return fs, nil
}

func upCmd(g *globals) *cobra.Command {
	var restart bool
	c := &cobra.Command{
		Use:   "up FILE...",
		Short: "Bring the VMs in FILEs up (idempotent: running VMs with the same spec are left alone)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withFiles(args, func(sup *supervisor.Supervisor, fs []*spec.File) error {
				return printUp(cmd, sup, fs, restart)
			})
		},
	}
	c.Flags().BoolVar(&restart, "restart-changed", false, "restart running VMs whose file changed (graceful down, then up; the previous spec comes back if the new one fails)")
	return c
}

// printUp runs Up and prints a line per VM; with restart, running VMs whose
// spec changed are restarted with it.
func printUp(cmd *cobra.Command, sup *supervisor.Supervisor, fs []*spec.File, restart bool) error {
	res, err := sup.Up(cmd.Context(), fs...)
	for _, r := range res {
		if r.Action == supervisor.Changed && restart && r.State == supervisor.StateRunning {
			i := slices.IndexFunc(fs, func(f *spec.File) bool { return f.VM.Name == r.VM })
			var rerr error
			if r, rerr = sup.Restart(cmd.Context(), fs[i]); rerr != nil {
				return rerr
			}
		}
		line := fmt.Sprintf("%s: %s (accel %s)", r.VM, r.Action, r.Accel)
		if r.Action == supervisor.Changed {
			line += "; spec differs from the running VM, not restarted (up --restart-changed, or down then up, to apply)"
			if r.State != supervisor.StateRunning && restart {
				line += "; not restarted while it is " + string(r.State)
			}
		}
		if r.Note != "" {
			line += "; " + r.Note
		}
		fmt.Fprintln(cmd.OutOrStdout(), line)
	}
	return err
}

// vmName accepts a VM name or a TOML file defining one.
func vmName(arg string) (string, error) {
	if strings.HasSuffix(arg, ".toml") || strings.ContainsRune(arg, '/') {
		f, err := spec.Load(arg)
		if err != nil {
			return "", err
		}
		return f.VM.Name, nil
	}
	if err := spec.ValidName(arg); err != nil {
		return "", fmt.Errorf("vm %q: %w", arg, err)
	}
	return arg, nil
}

func downCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "down NAME|FILE...",
		Short: "Shut VMs down: ACPI powerdown, wait stop_timeout, then QMP quit, then kill",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				failed := 0
				for _, a := range args {
					name, err := vmName(a)
					if err == nil {
						var r supervisor.DownResult
						r, err = sup.Down(cmd.Context(), name)
						if err == nil {
							msg := map[supervisor.StopStep]string{
								supervisor.StoppedAlready: "already shut off",
								supervisor.StoppedACPI:    "guest powered off (ACPI)",
								supervisor.StoppedAgent:   "guest powered off (guest agent)",
								supervisor.StoppedQuit:    "QEMU quit after the stop timeout",
								supervisor.StoppedKill:    "QEMU killed",
							}[r.Step]
							if r.Note != "" {
								msg += "; " + r.Note
							}
							fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (%s)\n", name, msg, r.Duration.Round(time.Millisecond))
						}
					}
					if err != nil {
						failed++
						if len(args) == 1 {
							return err
						}
						fmt.Fprintln(os.Stderr, "vmsup:", err)
					}
				}
				if failed > 0 {
					return fmt.Errorf("%d of %d VMs did not go down", failed, len(args))
				}
				return nil
			})
		},
	}
}

func lsCmd(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls",
		Short: "List VMs with their state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				sts, err := sup.List(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, sts)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tSTATE\tACCEL\tCPUS\tMEMORY\tPID\tBOOT")
				for _, s := range sts {
					state := string(s.State)
					if s.Reason != "" {
						state += " (" + s.Reason + ")"
					}
					boot := "-"
					if s.Autostart {
						boot = "enabled"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.Name, state, s.Accel, s.CPUs, s.Memory, pid(s.MainPID), boot)
				}
				return w.Flush()
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func pid(p uint32) string {
	if p == 0 {
		return "-"
	}
	return fmt.Sprint(p)
}

func statusCmd(g *globals) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a VM's state from systemd and QMP",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				s, err := sup.Status(cmd.Context(), name)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd, s)
				}
				out := cmd.OutOrStdout()
				state := string(s.State)
				if s.Reason != "" {
					state += " (" + s.Reason + ")"
				}
				fmt.Fprintf(out, "name:     %s\nstate:    %s\nunit:     %s %s\n", s.Name, state, s.Unit, s.UnitState)
				if s.MainPID != 0 {
					fmt.Fprintf(out, "pid:      %d\n", s.MainPID)
				}
				if s.Autostart {
					fmt.Fprintf(out, "boot:     enabled (vmsup disable %s to stop starting it at boot)\n", s.Name)
				}
				if s.Since != nil {
					fmt.Fprintf(out, "since:    %s\n", s.Since.Format(time.RFC3339))
				}
				accel := string(s.Accel)
				if s.AccelReason != "" {
					accel += " (" + s.AccelReason + ")"
				}
				fmt.Fprintf(out, "accel:    %s\ncpus:     %d\nmemory:   %s\n", accel, s.CPUs, s.Memory)
				if s.CPUModel != "" {
					cpu := s.CPUModel
					if len(s.CPUMasks) > 0 {
						cpu += " (masked: " + strings.Join(s.CPUMasks, ", ") + ", which this host's KVM refuses)"
					}
					fmt.Fprintf(out, "cpu:      %s\n", cpu)
				}
				if s.MemoryUsed > 0 {
					fmt.Fprintf(out, "rss:      %s (unit cgroup)\n", spec.Size(s.MemoryUsed/1024*1024))
				}
				fmt.Fprintf(out, "spec:     %s\ndir:      %s\nconsole:  %s (log %s)\n", s.SpecFile, s.StateDir, s.Console, s.ConsoleLog)
				printNICs(out, s.NICs)
				if c := s.Confinement; c != nil {
					fmt.Fprintf(out, "confined: %s\n", c)
				}
				if len(s.AttachedDisks) > 0 {
					fmt.Fprintf(out, "attached: %s\n", strings.Join(s.AttachedDisks, ", "))
				}
				if a := s.GuestAgent; a != nil {
					fmt.Fprintf(out, "agent:    %s\n", agentLine(*a))
				}
				return nil
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

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
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				var err error
				if op == "pause" {
					err = sup.Pause(cmd.Context(), name)
				} else {
					err = sup.Resume(cmd.Context(), name)
				}
				if err == nil {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", name, map[string]string{"pause": "paused", "resume": "running"}[op])
				}
				return err
			})
		},
	}
}
