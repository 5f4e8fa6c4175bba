package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/supervisor"
)

func networkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Managed networks: a bridge with DHCP, DNS and NAT for VMs (NICs of type \"network\")",
	}
	cmd.AddCommand(networkCreateCmd(g), networkLsCmd(g), networkRmCmd(g), networkUpCmd(g))
	return cmd
}

func networkCreateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "create FILE",
		Short:   "Define a network from its TOML file and bring it up (bridge, NAT, dnsmasq)",
		Example: "  vmsup network create lab.toml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, raw, err := netmanage.Load(args[0])
			if err != nil {
				return err
			}
			return g.with(func(sup *supervisor.Supervisor) error {
				if err := sup.Networks().Create(cmd.Context(), n, raw); err != nil {
					return err
				}
				v6 := "no IPv6"
				if n.IPv6On() {
					v6 = fmt.Sprintf("%s (%s)", n.IPv6CIDR(), n.Mode6())
				}
				return g.out.object(map[string]string{"network": n.Name, "bridge": n.Bridge, "ipv4": n.IPv4, "ipv6": n.IPv6CIDR()}, func(w io.Writer) {
					fmt.Fprintf(w, "network %s created: bridge %s, %s, %s, dnsmasq %s\n", n.Name, n.Bridge, n.IPv4, v6, netmanage.DnsmasqUnit(n.Name))
				})
			})
		},
	}
}

func networkUpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "up NAME",
		Short:   "Make what is missing of a defined network (after a host reboot); VMs' starts do it too",
		Example: "  vmsup network up lab",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				n, err := sup.Networks().Ensure(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return g.out.object(map[string]string{"network": n.Name}, func(w io.Writer) { fmt.Fprintf(w, "network %s is up\n", n.Name) })
			})
		},
	}
}

func networkRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Short:   "Remove a network (refused while a VM has a NIC on it)",
		Example: "  vmsup network rm lab",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				if err := sup.Networks().Remove(cmd.Context(), args[0]); err != nil {
					return err
				}
				return g.out.object(map[string]string{"network": args[0]}, func(w io.Writer) { fmt.Fprintf(w, "network %s removed\n", args[0]) })
			})
		},
	}
}

func networkLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Short:   "List the managed networks with their state and NICs",
		Example: "  vmsup network ls\n  vmsup network ls --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				infos, err := sup.Networks().List(cmd.Context())
				if err != nil {
					return err
				}
				return g.out.object(infos, func(w io.Writer) {
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NETWORK\tBRIDGE\tIPV4\tNAT\tIPV6\tBRIDGE-UP\tDNSMASQ\tNICS")
					for _, n := range infos {
						var nics []string
						for _, r := range n.NICs {
							addr := r.IP
							if r.IPv6 != "" {
								addr += "," + r.IPv6
							}
							nics = append(nics, fmt.Sprintf("%s/%s=%s", r.VM, r.NIC, addr))
						}
						v6 := "-"
						if n.IPv6 != "" {
							v6 = fmt.Sprintf("%s %s nat6=%v", n.IPv6, n.IPv6Mode, n.NAT6)
						}
						if n.Error != "" {
							nics = append(nics, "error: "+n.Error)
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%v\t%s\t%s\n", n.Name, dash(n.Bridge), dash(n.IPv4), n.NAT, v6, n.Up, dash(n.Dnsmasq), dash(strings.Join(nics, " ")))
					}
					tw.Flush()
				})
			})
		},
	}
}
