package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func backupCmd(g *globals) *cobra.Command {
	var o supervisor.BackupOptions
	var nbd string
	c := &cobra.Command{
		Use:   "backup NAME (--to DIR [--incremental] | --nbd SOCKET)",
		Short: "Back up a VM's writable disks into DIR: a full qcow2 copy, or with --incremental only what changed since DIR's last point",
		Long: "Back up every writable image disk of a VM, all at one moment, into DIR as a chain of qcow2 files\n" +
			"(an incremental one has the previous as its backing file) and DIR/manifest.json (the points and\n" +
			"their sha256 checksums). A running VM is copied by QEMU without pausing it; the writes since\n" +
			"the last point are tracked by a persistent dirty bitmap in the disk's qcow2 image, which\n" +
			"survives restarts. When that bitmap cannot be trusted (QEMU was killed, a snapshot moved the\n" +
			"disk onto a new overlay, the disk is raw), --incremental takes a full point and says why.\n" +
			"A VM that is off gets a full copy (qemu-img). vmsup opens the target files itself and passes\n" +
			"them to QEMU: DIR may be anywhere root can write. Restore with vmsup restore.\n\n" +
			"--nbd SOCKET serves instead, for an external backup tool, an NBD export of each disk as it was\n" +
			"when the command started (the guest runs on; QEMU keeps the old data aside) with a dirty bitmap\n" +
			"of what changed since the previous export (qemu:dirty-bitmap:vmsup-nbd-N), until Ctrl-C or\n" +
			"SIGTERM; the next export's bitmap starts at this one's moment.\n\n" +
			"With --remote, DIR is on the remote host, in one of its backup_dirs (a relative DIR is below the\n" +
			"first; docs/remote-api.md); --nbd is not remote.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				out := cmd.OutOrStdout()
				if nbd != "" {
					if o.Dir != "" || o.Incremental {
						return usageError{fmt.Errorf("--nbd serves an export instead of writing DIR: give it alone")}
					}
					local, ok := sup.(*supervisor.Supervisor)
					if !ok {
						return usageError{fmt.Errorf("backup --nbd serves on a socket of the VMs' host: not with --remote")}
					}
					return serveNBD(g, cmd, local, name, nbd)
				}
				o.Progress = backupProgress(g, name, out)
				res, err := sup.Backup(cmd.Context(), name, o)
				if g.json {
					ev := backupEvent{Name: name, Event: "done", Result: &res}
					if err != nil {
						ev = backupEvent{Name: name, Event: "failed", Error: toErrorJSON(err)}
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
				printBackup(out, res)
				return nil
			})
		},
	}
	c.Flags().StringVar(&o.Dir, "to", "", "backup directory (made if missing; one VM's chain per directory)")
	c.Flags().StringVar(&nbd, "nbd", "", "serve an NBD export of the disks at this moment on the unix socket SOCKET, until interrupted")
	c.Flags().BoolVar(&o.Incremental, "incremental", false, "copy only what changed since DIR's last point (needs a full one in DIR)")
	return c
}

// backupEvent is one line of backup --json: progress, then done or failed.
type backupEvent struct {
	Name     string                     `json:"name"`
	Event    string                     `json:"event"`
	Progress *supervisor.BackupProgress `json:"progress"`
	Result   *supervisor.BackupResult   `json:"result"`
	Export   *supervisor.ExportInfo     `json:"export"` // --nbd: what serves (event "serving")
	Error    *errorJSON                 `json:"error"`
}

// serveNBD is backup --nbd: it serves until the command is interrupted.
func serveNBD(g *globals, cmd *cobra.Command, sup *supervisor.Supervisor, name, socket string) error {
	out := cmd.OutOrStdout()
	err := sup.ExportNBD(cmd.Context(), name, supervisor.ExportOptions{Socket: socket, Ready: func(x supervisor.ExportInfo) {
		if g.json {
			g.out.line(backupEvent{Name: name, Event: "serving", Export: &x})
			return
		}
		fmt.Fprintf(out, "%s: serving its disks as they were at %s over NBD on %s (Ctrl-C ends it)\n", name, time.Now().Format("15:04:05"), x.Socket)
		for _, d := range x.Exports {
			bm := "no dirty bitmap (" + d.Reason + "): read it all"
			if d.Bitmap != "" {
				bm = "dirty bitmap qemu:dirty-bitmap:" + d.Bitmap + " (what changed since the previous export)"
			}
			fmt.Fprintf(out, "  disk %s: export %q, %s\n", d.Disk, d.Export, bm)
		}
	}})
	if g.json {
		ev := backupEvent{Name: name, Event: "done"}
		if err != nil {
			ev = backupEvent{Name: name, Event: "failed", Error: toErrorJSON(err)}
		}
		g.out.line(ev)
	}
	return err
}

func backupProgress(g *globals, name string, out io.Writer) func(supervisor.BackupProgress) {
	tty := isTerminal(out)
	return func(p supervisor.BackupProgress) {
		if g.json {
			g.out.line(backupEvent{Name: name, Event: "progress", Progress: &p})
			return
		}
		if !tty {
			return // the result line says it all
		}
		done := 0.0
		if p.Total > 0 {
			done = float64(p.Done) / float64(p.Total)
		}
		const width = 30
		n := int(done * width)
		fmt.Fprintf(out, "\r\x1b[K[%s%s] %3.0f%% %s of %s", strings.Repeat("#", n), strings.Repeat(".", width-n), done*100,
			humanBytes(float64(p.Done)), humanBytes(float64(p.Total)))
	}
}

func printBackup(w io.Writer, r supervisor.BackupResult) {
	how := "live"
	if !r.Live {
		how = "VM off"
	}
	if r.Live && r.Quiesced != "" {
		how += ", " + r.Quiesced
	}
	fmt.Fprintf(w, "%s: point %d in %s (%s, %s)\n", r.VM, r.Point, r.Dir, how, r.Duration.Round(time.Millisecond))
	for _, d := range r.Disks {
		fmt.Fprintf(w, "  %-12s %-11s %s copied (virtual size %s) -> %s\n", d.Disk, d.Mode, humanBytes(float64(d.Copied)),
			humanBytes(float64(d.Size)), d.File)
		if d.Reason != "" {
			fmt.Fprintf(w, "  %-12s full because %s\n", "", d.Reason)
		}
	}
}

func restoreCmd(g *globals) *cobra.Command {
	var o supervisor.RestoreOptions
	c := &cobra.Command{
		Use:   "restore DIR --to FILE [--disk DISK] [--point N] [--format raw|qcow2]",
		Short: "Write a disk as it was at a backup point into a new image, after checking the checksums of its chain",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Dir = args[0]
			return g.with(func(sup *supervisor.Supervisor) error {
				r, err := sup.Restore(cmd.Context(), o)
				if err != nil {
					return err
				}
				return g.out.object(r, func(w io.Writer) {
					fmt.Fprintf(w, "disk %s at point %d -> %s (%s; chain %s verified) in %s\n", r.Disk, r.Point, r.To, r.Format,
						strings.Join(r.Chain, " <- "), r.Duration.Round(time.Millisecond))
				})
			})
		},
	}
	f := c.Flags()
	f.StringVar(&o.To, "to", "", "the new image (must not exist)")
	f.StringVar(&o.Disk, "disk", "", "which disk (needed when the backups hold several)")
	f.IntVar(&o.Point, "point", 0, "which point (default the last)")
	f.StringVar(&o.Format, "format", "qcow2", "format of the new image: raw or qcow2")
	return c
}
