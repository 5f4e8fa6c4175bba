package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func migrateCmd(g *globals) *cobra.Command {
	var (
		o         supervisor.MigrateOptions
		transport string
		bandwidth string
		cancel    bool
	)
	c := &cobra.Command{
		Use:   "migrate NAME (--to HOST | --local) | migrate --cancel NAME",
		Short: "Live-migrate a running VM to another host running vmsup, or into a new QEMU on this host",
		Long: `Live-migrate a running VM. --to HOST runs "vmsup migrate-receive" on HOST through the
transport (default: ssh -o BatchMode=yes HOST vmsup migrate-receive), which starts the VM there
paused, waiting for the stream; the source streams to HOST's address (--address), and the
source's QEMU stops only once the destination runs the guest. On any failure before that,
the destination is torn down and the VM keeps running here. A local file disk (one the
destination does not see) is copied while the guest runs (storage migration: the destination
makes it, an overlay on the same stored image copies its top layer only); once the guest runs
there, this host's copy of it is removed unless --keep-source-disks.
--local moves the VM into a fresh QEMU on this host (to pick up a new QEMU binary); where
that QEMU has cpr-transfer (QEMU 10) and the VM's RAM is shared memory (VMs started on such a
QEMU), the new QEMU takes the RAM in place, so the pause does not grow with the guest's memory;
otherwise the RAM is copied and one line says why.
Ctrl-C, or "vmsup migrate --cancel NAME" from another shell, cancels.
With --remote, the remote host migrates (--local needs role operator, --to HOST admin; no --transport).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				if cancel {
					if err := sup.CancelMigration(cmd.Context(), name); err != nil {
						return err
					}
					g.out.action(actionJSON{Name: name, File: fileOf(args[0]), Action: "cancelled", Note: "migration cancelled"}, name+": migration cancelled")
					return nil
				}
				if (o.To == "") == !o.Local {
					return usageError{fmt.Errorf("give exactly one of --to HOST and --local")}
				}
				return runMove(cmd, g, name, &o, transport, bandwidth, sup.Migrate, printMigrated)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.To, "to", "", "destination host")
	f.BoolVar(&o.Local, "local", false, "migrate into a new QEMU process on this host")
	f.StringVar(&transport, "transport", "", `command that runs "vmsup migrate-receive" on the destination, split on spaces (default "ssh -o BatchMode=yes HOST vmsup migrate-receive")`)
	f.StringVar(&o.Address, "address", "", "address the destination QEMU listens on for the stream (default: HOST)")
	f.StringVar(&bandwidth, "bandwidth", "", "bandwidth limit in bytes per second, e.g. 512M (default QEMU's 128M)")
	f.DurationVar(&o.Downtime, "downtime", 0, "longest allowed pause at switch-over (default 300ms)")
	f.IntVar(&o.Multifd, "multifd", 0, "stream over N parallel connections")
	f.BoolVar(&o.AutoConverge, "auto-converge", false, "throttle the guest's vCPUs when it dirties memory faster than it can be sent")
	f.BoolVar(&o.Postcopy, "postcopy", false, "switch to postcopy when precopy has not finished after --postcopy-after (no rollback after the switch)")
	f.DurationVar(&o.PostcopyAfter, "postcopy-after", 0, "when to switch to postcopy (default 10s)")
	f.DurationVar(&o.Timeout, "timeout", 0, "cancel when the stream has not completed by then (default 10m)")
	f.DurationVar(&o.StallTimeout, "stall-timeout", 0, "cancel when nothing was transferred for this long (default 30s)")
	f.BoolVar(&o.KeepSourceDisks, "keep-source-disks", false, "keep this host's images of the disks copied to the destination")
	f.BoolVar(&o.NoCPR, "no-cpr", false, "with --local, copy the guest's RAM even where the new QEMU could take it in place (cpr-transfer)")
	f.BoolVar(&cancel, "cancel", false, "cancel the VM's migration in progress")
	return c
}

// printMigrated prints a finished migration: one line of figures and, for
// a local one that copied the guest's RAM, one line saying why.
func printMigrated(out io.Writer, name string, res supervisor.MigrateResult) {
	pause := ""
	if res.Pause > 0 {
		pause = ", guest paused " + res.Pause.Round(100*time.Microsecond).String()
	}
	if res.Mode == supervisor.MigrationModeCPRTransfer {
		fmt.Fprintf(out, "%s: migrated to %s in %s (cpr-transfer: the new QEMU took the guest's RAM in place%s, QEMU downtime %s)\n",
			name, res.To, res.Wall.Round(time.Millisecond), pause, res.Downtime)
		return
	}
	disks := ""
	if res.Disks > 0 {
		disks = fmt.Sprintf(", %d disk(s) copied: %s in %s", res.Disks, humanBytes(float64(res.DiskTransferred)), res.DiskTime.Round(time.Millisecond))
	}
	fmt.Fprintf(out, "%s: migrated to %s in %s (QEMU total %s, downtime %s%s, %s transferred%s)\n",
		name, res.To, res.Wall.Round(time.Millisecond), res.TotalTime, res.Downtime, pause, humanBytes(float64(res.Transferred)), disks)
	if res.ModeNote != "" {
		fmt.Fprintf(out, "%s: RAM copied, not taken over in place (cpr-transfer): %s\n", name, res.ModeNote)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressPrinter renders progress as JSON lines, a bar redrawn in place
// on a terminal, or one plain line per report otherwise.
func progressPrinter(g *globals, name string, out io.Writer) func(supervisor.MigrationProgress) {
	tty := isTerminal(out)
	return func(p supervisor.MigrationProgress) {
		if g.json {
			g.out.line(migrateEvent{Name: name, Event: "progress", Progress: &p})
			return
		}
		done := 0.0
		if p.Transferred+p.Remaining > 0 {
			done = float64(p.Transferred) / float64(p.Transferred+p.Remaining)
		}
		line := fmt.Sprintf("%-9s %s sent, %s left, %s/s, dirty %s/s, expected downtime %s, pass %d",
			p.Status, humanBytes(float64(p.Transferred)), humanBytes(float64(p.Remaining)), humanBytes(p.Rate),
			humanBytes(float64(p.DirtyRate)), p.ExpectedDowntime, p.Iterations)
		if p.DiskTotal > 0 {
			if p.Status == "disks" {
				done = float64(p.DiskTransferred) / float64(p.DiskTotal)
				line = fmt.Sprintf("%-9s %s of %s copied", p.Status, humanBytes(float64(p.DiskTransferred)), humanBytes(float64(p.DiskTotal)))
			} else {
				line += fmt.Sprintf(", disks %s copied", humanBytes(float64(p.DiskTransferred)))
			}
		}
		if !tty {
			fmt.Fprintf(out, "%6.1fs %s\n", p.Elapsed.Seconds(), line)
			return
		}
		const width = 30
		n := int(done * width)
		fmt.Fprintf(out, "\r\x1b[K[%s%s] %3.0f%% %s", strings.Repeat("#", n), strings.Repeat(".", width-n), done*100, line)
	}
}

func humanBytes(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}

// migrateEvent is one line of migrate --json: progress reports, then done
// (with the result) or failed (with the error).
type migrateEvent struct {
	Name     string                        `json:"name"`
	Event    string                        `json:"event"` // progress, done, failed
	Progress *supervisor.MigrationProgress `json:"progress"`
	Result   *supervisor.MigrateResult     `json:"result"`
	Error    *errorJSON                    `json:"error"`
}

// runMove is migrate's and move's common run: the transport and bandwidth
// flags into o, progress while it runs, then the result (a JSON line, or
// show's text).
func runMove(cmd *cobra.Command, g *globals, name string, o *supervisor.MigrateOptions, transport, bandwidth string,
	run func(context.Context, string, supervisor.MigrateOptions) (supervisor.MigrateResult, error),
	show func(io.Writer, string, supervisor.MigrateResult)) error {
	if transport != "" {
		if g.rem.url != "" {
			return usageError{fmt.Errorf("--transport runs a command on the VMs' host: not with --remote (the remote host's ssh is used)")}
		}
		o.Transport = strings.Fields(transport)
	}
	if bandwidth != "" {
		bw, err := spec.ParseSize(bandwidth)
		if err != nil {
			return usageError{fmt.Errorf("--bandwidth: %w", err)}
		}
		o.Bandwidth = int64(bw)
	}
	out := cmd.OutOrStdout()
	o.Progress = progressPrinter(g, name, out)
	res, err := run(cmd.Context(), name, *o)
	if g.json {
		ev := migrateEvent{Name: name, Event: "done", Result: &res}
		if err != nil {
			ev = migrateEvent{Name: name, Event: "failed", Error: toErrorJSON(err)}
		}
		g.out.line(ev)
		return err
	}
	if isTerminal(out) {
		fmt.Fprintln(out)
	}
	if err != nil {
		return err
	}
	show(out, name, res)
	return nil
}
