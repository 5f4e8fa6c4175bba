package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func moveCmd(g *globals) *cobra.Command {
	var (
		o         supervisor.MigrateOptions
		transport string
		bandwidth string
	)
	c := &cobra.Command{
		Use:   "move NAME --to HOST",
		Short: "Move a shut-off VM, with its local disks, to another host running vmsup",
		Long: `Move a shut-off VM to another host. As "vmsup migrate", --to HOST runs "vmsup migrate-receive"
on HOST through the transport (default: ssh -o BatchMode=yes HOST vmsup migrate-receive). HOST
makes each local disk it does not see (same format and size; an overlay on a stored image it has,
or pulls by digest, takes the top layer only) and exports it; this host copies each disk into it
(qemu-storage-daemon on both hosts), then HOST defines the VM, shut off. The VM and, unless
--keep-source-disks, its copied disks are then gone from here. A running VM is refused: vmsup
migrate moves it live. A move killed half-way is settled by the next command on either host:
the VM is defined on exactly one of them.
With --remote, the remote host moves it (role admin; no --transport).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				if o.To == "" {
					return usageError{fmt.Errorf("give --to HOST")}
				}
				return runMove(cmd, g, name, &o, transport, bandwidth, sup.Move, printMoved)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.To, "to", "", "destination host")
	f.StringVar(&transport, "transport", "", `command that runs "vmsup migrate-receive" on the destination, split on spaces (default "ssh -o BatchMode=yes HOST vmsup migrate-receive")`)
	f.StringVar(&o.Address, "address", "", "address the destination listens on for the disks' copy (default: HOST)")
	f.StringVar(&bandwidth, "bandwidth", "", "bandwidth limit of the disks' copy in bytes per second, e.g. 512M (default: unbounded)")
	f.DurationVar(&o.Timeout, "timeout", 0, "give up when the disks are not copied by then (default 10m)")
	f.DurationVar(&o.StallTimeout, "stall-timeout", 0, "give up when nothing was copied for this long (default 30s)")
	f.BoolVar(&o.KeepSourceDisks, "keep-source-disks", false, "keep this host's images of the disks copied to the destination")
	return c
}

// printMoved prints a finished move in one line (and a second for what
// could not be cleaned up here).
func printMoved(out io.Writer, name string, res supervisor.MigrateResult) {
	disks := "no disk copied (the destination sees them)"
	if res.Disks > 0 {
		disks = fmt.Sprintf("%d disk(s) copied: %s in %s", res.Disks, humanBytes(float64(res.DiskTransferred)), res.DiskTime.Round(time.Millisecond))
	}
	fmt.Fprintf(out, "%s: moved to %s in %s (%s); it is shut off there\n", name, res.To, res.Wall.Round(time.Millisecond), disks)
	if res.Note != "" {
		fmt.Fprintf(out, "%s: %s\n", name, res.Note)
	}
}
