package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func nicCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "nic",
		Short: "Hot-plug NICs into a running VM and unplug them",
	}
	c.AddCommand(nicAttachCmd(g), nicDetachCmd(g), nicLsCmd(g))
	return c
}

func nicAttachCmd(g *globals) *cobra.Command {
	var n spec.NIC
	var sndbuf string
	c := &cobra.Command{
		Use:   "attach NAME NIC",
		Short: "Hot-plug a NIC (same fields as [[nic]] in a VM file) into a running VM",
		Long: `Hot-plug a NIC into a running VM. Every field of [[nic]] in a VM file is a flag
(its name with - for _; forwards and security_groups are repeatable as --forward and
--security-group).`,
		Example: "  vmsup nic attach web lan1 --type bridge --bridge br0\n" +
			"  vmsup nic attach web uplink --type ovs --bridge ovsbr0 --mtu 9000\n" +
			"  vmsup nic attach web lab1 --type network --network lab --security-group web",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sndbuf != "" {
				b, err := spec.ParseSize(sndbuf)
				if err != nil {
					return usageError{fmt.Errorf("--sndbuf: %w", err)}
				}
				n.SndBuf = b
			}
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				n.Name = args[1]
				got, err := sup.AttachNIC(cmd.Context(), name, n)
				if err != nil {
					return err
				}
				line := fmt.Sprintf("%s: nic %s attached (type %s, mac %s", name, got.Name, got.Type, got.MAC)
				if got.Tap != "" {
					line += ", tap " + got.Tap
				}
				g.out.action(actionJSON{Name: name, File: fileOf(args[0]), Action: "attached", State: "running",
					Note: fmt.Sprintf("nic %s: type %s, mac %s, tap %s", got.Name, got.Type, got.MAC, dash(got.Tap))}, line+")")
				return nil
			})
		},
	}
	nicFlags(c, &n, &sndbuf)
	return c
}

// nicFlags are [[nic]]'s fields as flags of nic attach (nic_test.go checks
// that none is missing).
func nicFlags(c *cobra.Command, n *spec.NIC, sndbuf *string) {
	f := c.Flags()
	f.StringVar(&n.Type, "type", "user", `"user", "bridge", "ovs", "cni" or "network"`)
	f.StringVar(&n.MAC, "mac", "", "MAC address (default: derived from the VM name and NIC index)")
	f.StringVar(&n.Model, "model", "", `the guest's NIC: "virtio" (default) or "e1000e"`)
	f.StringVar(&n.Link, "link", "", `link state the guest sees: "up" (default) or "down"`)
	f.StringVar(&n.Bridge, "bridge", "", "bridge and ovs: the existing bridge")
	f.StringVar(&n.CNIConfig, "cni-config", "", "cni: the .conflist path")
	f.StringVar(&n.Network, "network", "", "network: the managed network (vmsup network ls)")
	f.StringVar(&n.IP, "ip", "", "network: the guest's IPv4 address (default: one vmsup picks)")
	f.BoolVar(&n.AllowSpoofing, "allow-spoofing", false, "network: let the guest send as other addresses")
	f.StringSliceVar(&n.SecurityGroups, "security-group", nil, "network: a [[security_group]] of the VM's file (repeatable)")
	f.StringVar(&n.Tap, "tap", "", "tap name (default: derived from the VM and NIC names)")
	f.IntVar(&n.MTU, "mtu", 0, "tap and guest MTU (0: the bridge's)")
	f.IntVar(&n.Queues, "queues", 0, "virtio-net queue pairs (default 1)")
	f.BoolVar(&n.Multiqueue, "multiqueue", false, "one queue pair per vCPU")
	f.StringVar(&n.Vhost, "vhost", "", `"auto" (default), "on" or "off"`)
	f.IntVar(&n.RxQueueSize, "rx-queue-size", 0, "virtio-net receive queue size (256..1024, a power of 2)")
	f.IntVar(&n.TxQueueSize, "tx-queue-size", 0, "virtio-net transmit queue size (256..1024, a power of 2)")
	f.StringVar(sndbuf, "sndbuf", "", "tap NICs: bound of the tap's send buffer (e.g. 1M; default the kernel's)")
	f.StringSliceVar(&n.Forwards, "forward", nil, `user: host forward "tcp:127.0.0.1:2222-:22" (repeatable)`)
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
				g.out.action(actionJSON{Name: name, File: fileOf(args[0]), Action: "detached", State: "running", Note: "nic " + args[1]}, fmt.Sprintf("%s: nic %s detached", name, args[1]))
				return nil
			})
		},
	}
}
