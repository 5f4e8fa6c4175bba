package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func setCmd(g *globals) *cobra.Command {
	var (
		cpus, quota, weight int
		memory              string
	)
	c := &cobra.Command{
		Use:   "set NAME [--cpus N] [--memory SIZE] [--cpu-quota PCT] [--cpu-weight N]",
		Short: "Change a running VM's vCPUs, memory and CPU limits live (up to max_cpus / max_memory)",
		Long: `Hot-plugs vCPUs (up to max_cpus) and memory DIMMs (up to max_memory, in steps
of 128M; hot-plugged DIMMs can be removed again), and changes the unit's CPU
quota and weight. The changes last while this QEMU runs: the VM's file stays
its configuration, so edit it to keep them at the next up.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var o supervisor.ResizeOptions
			o.CPUs = cpus
			if memory != "" {
				m, err := spec.ParseSize(memory)
				if err != nil {
					return usageError{fmt.Errorf("--memory: %w", err)}
				}
				if m <= 0 {
					return usageError{fmt.Errorf("--memory %q: want a size such as 512M or 2G", memory)}
				}
				o.Memory = m
			}
			if cmd.Flags().Changed("cpu-quota") {
				o.CPUQuota = &quota
			}
			if cmd.Flags().Changed("cpu-weight") {
				o.CPUWeight = &weight
			}
			if o.CPUs == 0 && o.Memory == 0 && o.CPUQuota == nil && o.CPUWeight == nil {
				return usageError{fmt.Errorf("nothing to set: give --cpus, --memory, --cpu-quota or --cpu-weight")}
			}
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				r, err := sup.Resize(cmd.Context(), name, o)
				if err != nil {
					return err
				}
				if g.json {
					return g.out.object(resizeJSON{Name: r.VM, CPUs: r.CPUs, MaxCPUs: r.MaxCPUs, Memory: r.Memory.String(), MaxMemory: r.MaxMemory.String(), Note: r.Note}, nil)
				}
				line := fmt.Sprintf("%s: %d vCPUs (max %d), memory %s (max %s)", r.VM, r.CPUs, r.MaxCPUs, r.Memory, r.MaxMemory)
				if r.Note != "" {
					line += "; " + r.Note
				}
				fmt.Fprintln(cmd.OutOrStdout(), line)
				return nil
			})
		},
	}
	f := c.Flags()
	f.IntVar(&cpus, "cpus", 0, "vCPUs the guest should have (more are hot-plugged)")
	f.StringVar(&memory, "memory", "", "guest memory, e.g. 768M (DIMMs added or hot-plugged ones removed)")
	f.IntVar(&quota, "cpu-quota", 0, "CPU quota in percent of one CPU (0 = none)")
	f.IntVar(&weight, "cpu-weight", 0, "CPU weight, 1-10000")
	return c
}
