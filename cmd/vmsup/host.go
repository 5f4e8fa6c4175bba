package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/lifecycle/memstate"
	"github.com/vmsup/vmsup/supervisor"
)

func hostCmd(g *globals) *cobra.Command {
	var refresh bool
	c := &cobra.Command{
		Use:   "host",
		Short: "Show what this host's QEMU and KVM can run (the host probe), with the reason for every no",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.with(func(sup *supervisor.Supervisor) error {
				t0 := time.Now()
				c, err := sup.HostCaps(cmd.Context(), refresh)
				if err != nil {
					return err
				}
				if g.json {
					return g.out.object(c, nil) // the probe's record (internal/host/caps), as cached
				}
				printHost(cmd.OutOrStdout(), c, time.Since(t0))
				return nil
			})
		},
	}
	c.Flags().BoolVar(&refresh, "refresh", false, "probe again even if the cached record is still valid")
	return c
}

func printHost(out io.Writer, c *supervisor.HostCaps, took time.Duration) {
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "no"
	}
	q := c.QEMU
	fmt.Fprintf(out, "qemu:        %s %s (%d machine types, %d CPU models, %d device types, %d QMP commands)\n",
		q.Binary, q.Version, len(q.Machines), len(q.Models), len(q.Devices), len(q.Commands))
	if len(q.Missing) > 0 {
		fmt.Fprintf(out, "             missing QMP commands vmsup needs: %s\n", strings.Join(q.Missing, ", "))
	}
	fmt.Fprintf(out, "mem state:   %s\n", memStateLine(q.MigrationCaps))
	k := c.KVM
	kvm := k.Kind
	if k.Reason != "" {
		kvm += " (" + k.Reason + ")"
	}
	fmt.Fprintf(out, "kvm:         %s\n", kvm)
	for _, m := range k.Modes {
		line := fmt.Sprintf("  -cpu %-7s starts: %s", m.Model, yes(m.Starts))
		if len(m.Masks) > 0 {
			line += " with " + strings.Join(m.Masks, ", ") + " off"
		}
		if m.Error != "" {
			line += "; without: " + m.Error
			if !m.Starts {
				line = fmt.Sprintf("  -cpu %-7s starts: no: %s", m.Model, m.Error)
			}
		}
		fmt.Fprintln(out, line)
	}
	if a, why, err := c.Accel("auto"); err == nil {
		line := string(a)
		if why != "" {
			line += " (" + strings.TrimPrefix(why, "auto chose tcg: ") + ")"
		}
		fmt.Fprintf(out, "accel auto:  %s\n", line)
	}
	f := c.Facts
	facts := []struct {
		name string
		f    supervisor.HostFact
	}{
		{"vhost-net", f.VhostNet}, {"vhost-vsock", f.VhostVsock}, {"userfaultfd", f.Userfaultfd},
		{"io_uring", f.IOURing}, {"apparmor", f.AppArmor}, {"ovs datapath", f.OVSDatapath},
		{"hugepages", f.Hugepages}, {"iommu", f.IOMMU},
	}
	for _, x := range facts {
		fmt.Fprintf(out, "%-13s%s\n", x.name+":", factLine(x.f))
	}
	names := make([]string, 0, len(f.Helpers))
	for n := range f.Helpers {
		names = append(names, n)
	}
	sort.Strings(names)
	var have, missing []string
	for _, n := range names {
		if f.Helpers[n].OK {
			have = append(have, n)
		} else {
			missing = append(missing, n)
		}
	}
	fmt.Fprintf(out, "helpers:     %s\n", strings.Join(have, " "))
	if len(missing) > 0 {
		fmt.Fprintf(out, "not found:   %s\n", strings.Join(missing, " "))
	}
	src := fmt.Sprintf("probed %s ago in %s", time.Since(c.ProbedAt).Round(time.Second), c.ProbeCost.Round(time.Millisecond))
	if c.Cached {
		src += fmt.Sprintf("; read from the cache in %s", c.LoadCost.Round(10*time.Microsecond))
	}
	fmt.Fprintf(out, "record:      %s (%s)\n", src, took.Round(time.Millisecond))
}

// memStateLine says how memory snapshots go to their file on this QEMU.
func memStateLine(caps []string) string {
	if memstate.WayOf(caps).MappedRAM {
		return "file: with mapped-ram (RAM at fixed offsets in a sparse file)"
	}
	return "fd: (this QEMU has no mapped-ram)"
}

func factLine(f supervisor.HostFact) string {
	switch {
	case f.OK && f.Detail != "":
		return "yes: " + f.Detail
	case f.OK:
		return "yes"
	case f.Detail != "":
		return "no: " + f.Reason + " (" + f.Detail + ")"
	}
	return "no: " + f.Reason
}
