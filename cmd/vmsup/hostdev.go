package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func hostdevCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "hostdev",
		Short: "Pass a host PCI device through to a running VM (VFIO), and take it back",
	}
	c.AddCommand(hostdevAttachCmd(g), hostdevDetachCmd(g))
	return c
}

func hostdevAttachCmd(g *globals) *cobra.Command {
	var h spec.HostDev
	var romBar bool
	c := &cobra.Command{
		Use:   "attach NAME ADDRESS",
		Short: "Hot-plug the host PCI device at ADDRESS into a running VM, until it stops (a device to boot with goes in the file's [[hostdev]])",
		Example: "  vmsup hostdev attach web 0000:01:00.0\n" +
			"  vmsup hostdev attach web 01:00.0 --name gpu --rom-bar=false",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				h.Address = args[1]
				if cmd.Flags().Changed("rom-bar") {
					h.ROMBar = &romBar
				}
				if err := sup.AttachHostDev(cmd.Context(), name, h); err != nil {
					return err
				}
				g.out.action(actionJSON{Name: name, File: fileOf(args[0]), Action: "attached", State: "running",
					Note: "hostdev " + args[1]}, fmt.Sprintf("%s: host device %s attached", name, args[1]))
				return nil
			})
		},
	}
	c.Flags().StringVar(&h.Name, "name", "", "device name (default derived from the address)")
	c.Flags().BoolVar(&romBar, "rom-bar", true, "map the device's option ROM")
	return c
}

func hostdevDetachCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "detach NAME ADDRESS|DEVICE",
		Short: "Unplug a hot-plugged host PCI device and give it back to its host driver",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				if err := sup.DetachHostDev(cmd.Context(), name, args[1]); err != nil {
					return err
				}
				g.out.action(actionJSON{Name: name, File: fileOf(args[0]), Action: "detached", State: "running",
					Note: "hostdev " + args[1]}, fmt.Sprintf("%s: host device %s detached", name, args[1]))
				return nil
			})
		},
	}
}
