package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func statusCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "status NAME",
		Short: "Show a VM's state from systemd and QMP",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				s, err := sup.Status(cmd.Context(), name)
				if err != nil {
					return err
				}
				if g.json {
					return g.out.object(s, nil)
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
				if s.Description != "" {
					fmt.Fprintf(out, "about:    %s\n", s.Description)
				}
				if s.Since != nil {
					fmt.Fprintf(out, "since:    %s (up %s)\n", s.Since.Format(time.RFC3339), uptime(*s.Since))
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
				if s.UUID != "" {
					fmt.Fprintf(out, "uuid:     %s\n", s.UUID)
				}
				if s.VsockCID != 0 {
					fmt.Fprintf(out, "vsock:    cid %d\n", s.VsockCID)
				}
				printSecureBoot(out, s.SecureBoot)
				for _, h := range s.HostDevs {
					how := "in the file"
					if h.Attached {
						how = "hot-plugged, until the VM stops"
					}
					fmt.Fprintf(out, "hostdev:  %s (%s, %s)\n", h.Address, h.Name, how)
				}
				if len(s.Snapshots) > 0 {
					fmt.Fprintf(out, "snapshots: %s (current %s; vmsup snapshot ls %s)\n", strings.Join(s.Snapshots, ", "), orDash(s.CurrentSnapshot), s.Name)
				}
				if s.MemoryUsed > 0 {
					fmt.Fprintf(out, "rss:      %s (unit cgroup)\n", spec.Size(s.MemoryUsed/1024*1024))
				}
				fmt.Fprintf(out, "spec:     %s\ndir:      %s\nconsole:  %s (log %s)\n", s.SpecFile, s.StateDir, s.Console, s.ConsoleLog)
				if s.Sync != "" {
					line := fmt.Sprintf("%s (generation %d)", s.Sync, s.Generation)
					if s.Sync == supervisor.SyncChanged {
						line += "; vmsup plan " + s.SpecFile + " says how it applies"
					}
					fmt.Fprintf(out, "file:     %s\n", line)
				}
				printPending(out, s)
				for _, m := range s.MovedDisks {
					fmt.Fprintf(out, "moved:    %s (vmsup disk move; the file still names the old image: update it)\n", m)
				}
				printDisks(out, s.Disks, s.DiskIO)
				printNICs(out, s.NICs)
				if c := s.Confinement; c != nil {
					fmt.Fprintf(out, "confined: %s\n", c)
				}
				if a := s.GuestAgent; a != nil {
					fmt.Fprintf(out, "agent:    %s\n", agentLine(*a))
					for _, ad := range a.Addresses {
						fmt.Fprintf(out, "ip:       %s on %s (%s)\n", ad.Address, ad.Interface, ad.MAC)
					}
				}
				return nil
			})
		},
	}
	return c
}

// printPending adds the changes an apply left, each a plan line with its
// own class, under one line saying what they wait for.
func printPending(out io.Writer, s supervisor.Status) {
	if len(s.Pending) == 0 {
		return
	}
	when := "a restart (vmsup apply --restart)"
	if s.PendingAtReboot {
		when = "the guest's next reboot"
	}
	fmt.Fprintf(out, "pending:  %d change(s) an apply left for %s:\n", len(s.Pending), when)
	for _, p := range s.Pending {
		fmt.Fprintf(out, "          %s\n", p)
	}
}

// printDisks adds the VM's disks, and how their I/O goes, to status output.
func printDisks(out io.Writer, disks []supervisor.DiskInfo, diskIO string) {
	if diskIO != "" {
		fmt.Fprintf(out, "disk io:  %s\n", diskIO)
	}
	for _, d := range disks {
		fmt.Fprintf(out, "disk:     %s %s %s", d.Name, d.Type, d.Source)
		if d.Format != "" {
			fmt.Fprintf(out, " (%s)", d.Format)
		}
		if d.ReadOnly {
			fmt.Fprint(out, " read-only")
		}
		if d.Hotplugged {
			fmt.Fprint(out, " hot-plugged")
		}
		if d.IOLimits != "" {
			fmt.Fprintf(out, " limits %s", d.IOLimits)
		}
		fmt.Fprintln(out)
	}
}

// printNICs adds the VM's NICs, with the host side of tap NICs, to status output.
func printNICs(out io.Writer, nics []supervisor.NICInfo) {
	for _, n := range nics {
		fmt.Fprintf(out, "nic:      %s %s mac %s link %s", n.Name, n.Type, n.MAC, n.Link)
		if n.Tap != "" {
			where := n.Bridge
			if where == "" {
				where = "-"
			}
			fmt.Fprintf(out, " tap %s (present %v) on %s", n.Tap, n.TapUp, where)
		}
		if len(n.Forwards) > 0 {
			fmt.Fprintf(out, " forwards %s", strings.Join(n.Forwards, ","))
		}
		if len(n.Addrs) > 0 {
			fmt.Fprintf(out, " addr %s gw %s", strings.Join(n.Addrs, ","), n.Gateway)
		}
		if n.Network != "" {
			fmt.Fprintf(out, " network %s anti-spoofing %v", n.Network, n.AntiSpoofing)
			if len(n.SecurityGroups) > 0 {
				fmt.Fprintf(out, " security-groups %s", strings.Join(n.SecurityGroups, ","))
			}
			if d := n.Dropped; d != nil {
				fmt.Fprintf(out, " dropped spoofed %d filtered %d", d.Spoofed, d.Filtered)
			}
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

// uptime is a short duration since t: "3d4h", "2h5m", "42s".
func uptime(t time.Time) string {
	d := time.Since(t).Round(time.Second)
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	case d >= time.Minute:
		return fmt.Sprintf("%dm%ds", d/time.Minute, d%time.Minute/time.Second)
	}
	return d.String()
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

// printSecureBoot shows a UEFI VM's Secure Boot state and enrolled keys.
func printSecureBoot(out io.Writer, sb *supervisor.SecureBootStatus) {
	switch {
	case sb == nil:
		return
	case sb.Err != "":
		fmt.Fprintf(out, "uefi:     variable store unreadable: %s\n", sb.Err)
		return
	case sb.Enforced:
		fmt.Fprintln(out, "uefi:     Secure Boot enforced")
	default:
		fmt.Fprintln(out, "uefi:     Secure Boot not enforced (no PK enrolled)")
	}
	for _, c := range sb.Certs {
		fmt.Fprintf(out, "  %-4s %s (expires %s)\n", c.Var, c.Subject, c.NotAfter.Format("2006-01-02"))
	}
	if sb.Warning != "" {
		fmt.Fprintf(out, "  warning: %s\n", sb.Warning)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
