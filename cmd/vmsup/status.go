package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

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

// printNICs adds the host side of each tap NIC to status output.
func printNICs(out io.Writer, nics []supervisor.NICStatus) {
	for _, n := range nics {
		where := n.Bridge
		if where == "" {
			where = "-"
		}
		fmt.Fprintf(out, "nic:      %s %s tap %s (present %v) on %s", n.Name, n.Type, n.Tap, n.TapUp, where)
		if len(n.Addrs) > 0 {
			fmt.Fprintf(out, " addr %s gw %s", strings.Join(n.Addrs, ","), n.Gateway)
		}
		if n.CNICheck != "" {
			fmt.Fprintf(out, " cni-check %s", n.CNICheck)
		}
		if n.Hotplug {
			fmt.Fprint(out, " hot-plugged")
		}
		fmt.Fprintln(out)
	}
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
