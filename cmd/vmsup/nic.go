package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func nicCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "nic",
		Short: "Hot-plug NICs into a running VM and unplug them",
	}
	c.AddCommand(nicAttachCmd(g), nicDetachCmd(g))
	return c
}

func nicAttachCmd(g *globals) *cobra.Command {
	var n spec.NIC
	c := &cobra.Command{
		Use:   "attach NAME NIC",
		Short: "Hot-plug a NIC (same fields as [[nic]] in a VM file) into a running VM",
		Example: "  vmsup nic attach web lan1 --type bridge --bridge br0\n" +
			"  vmsup nic attach web uplink --type ovs --bridge ovsbr0 --mtu 9000",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				n.Name = args[1]
				got, err := sup.AttachNIC(cmd.Context(), name, n)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: nic %s attached (type %s, mac %s", name, got.Name, got.Type, got.MAC)
				if got.Tap != "" {
					fmt.Fprintf(cmd.OutOrStdout(), ", tap %s", got.Tap)
				}
				fmt.Fprintln(cmd.OutOrStdout(), ")")
				return nil
			})
		},
	}
	f := c.Flags()
	f.StringVar(&n.Type, "type", "user", `"user", "bridge", "ovs" or "cni"`)
	f.StringVar(&n.MAC, "mac", "", "MAC address (default: derived from the VM name and NIC index)")
	f.StringVar(&n.Bridge, "bridge", "", "bridge and ovs: the existing bridge")
	f.StringVar(&n.CNIConfig, "cni-config", "", "cni: the .conflist path")
	f.StringVar(&n.Tap, "tap", "", "tap name (default: derived from the VM and NIC names)")
	f.IntVar(&n.MTU, "mtu", 0, "tap and guest MTU (0: the bridge's)")
	f.IntVar(&n.Queues, "queues", 0, "virtio-net queue pairs (default 1)")
	f.BoolVar(&n.Multiqueue, "multiqueue", false, "one queue pair per vCPU")
	f.StringVar(&n.Vhost, "vhost", "", `"auto" (default), "on" or "off"`)
	f.StringSliceVar(&n.Forwards, "forward", nil, `user: host forward "tcp:127.0.0.1:2222-:22" (repeatable)`)
	return c
}

func nicDetachCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "detach NAME NIC",
		Short: "Unplug a hot-plugged NIC from a running VM and remove its tap",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				if err := sup.DetachNIC(cmd.Context(), name, args[1]); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: nic %s detached\n", name, args[1])
				return nil
			})
		},
	}
}

func stopPostCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "stop-post NAME",
		Short:  "Network clean-up run by the VM's unit (ExecStopPost=); not for direct use",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				if err := sup.StopPost(cmd.Context(), args[0]); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "vmsup stop-post %s: network removed\n", args[0])
				return nil
			})
		},
	}
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
