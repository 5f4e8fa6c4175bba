package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/host/userfile"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func diskMoveCmd(g *globals) *cobra.Command {
	var (
		to, format, specFile, speed string
		cancel                      bool
	)
	c := &cobra.Command{
		Use:   "move NAME DISK (--to PATH [--format F] | --spec DISK.toml) | move --cancel NAME DISK",
		Short: "Move a disk of a running VM to a new image while the guest runs (blockdev-mirror)",
		Long: `Move a disk of a running VM to a new image while the guest goes on using it: QEMU
copies the disk (blockdev-mirror), keeps the copy in sync, then switches the disk
over to it and closes the old image, which is left as it is (delete it yourself).
--to PATH creates a new image file (qcow2 or raw, from the extension or --format) in
an image directory; --spec takes a TOML file with the keys of one [[disk]] table (an
image file, or an existing RBD image of the disk's size) at top level.
Ctrl-C, or "vmsup disk move --cancel NAME DISK" from another shell, cancels: the disk
stays on its image and the target is removed.
The VM's record follows: a hot-plugged disk is rewritten; for a disk of the VM's file
the next up boots from the new image while the file still names the old one:
update the file to name the new image.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, vm string) error {
				disk := args[1]
				if cancel {
					if err := sup.CancelDiskMove(cmd.Context(), vm, disk); err != nil {
						return err
					}
					if g.json {
						g.out.line(moveEvent{Name: vm, Disk: disk, Event: "cancel-requested"})
						return nil
					}
					g.out.action(actionJSON{Name: vm, File: fileOf(args[0]), Action: "cancelled", Note: "disk " + disk + ": move cancelled"},
						fmt.Sprintf("%s: disk %s: move cancelled", vm, disk))
					return nil
				}
				o, err := moveOptions(vm, to, format, specFile, speed)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				o.Progress = moveProgressPrinter(g, vm, out)
				res, err := sup.MoveDisk(cmd.Context(), vm, disk, o)
				if g.json {
					ev := moveEvent{Name: vm, Disk: disk, Event: "done", Result: &res}
					if err != nil {
						ev = moveEvent{Name: vm, Disk: disk, Event: "failed", Error: toErrorJSON(err)}
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
				fmt.Fprintf(out, "%s: disk %s moved from %s to %s in %s (%s copied)\n", vm, disk, res.From, res.To,
					res.Duration.Round(time.Millisecond), humanBytes(float64(res.Bytes)))
				if res.Note != "" {
					fmt.Fprintf(out, "note: %s\n", res.Note)
				}
				return nil
			})
		},
	}
	f := c.Flags()
	f.StringVar(&to, "to", "", "new image file to move the disk to (created; in an image directory)")
	f.StringVar(&format, "format", "", "qcow2 or raw (default from the extension of --to)")
	f.StringVar(&specFile, "spec", "", "TOML file describing the target disk (keys of a [[disk]] table)")
	f.StringVar(&speed, "speed", "", "copy at most this many bytes per second, e.g. 100M (default: as fast as it goes)")
	f.BoolVar(&cancel, "cancel", false, "cancel the move of DISK in progress")
	return c
}

// moveOptions reads the target from the flags.
func moveOptions(vm, to, format, specFile, speed string) (supervisor.MoveOptions, error) {
	var o supervisor.MoveOptions
	switch {
	case (to == "") == (specFile == ""):
		return o, usageError{fmt.Errorf("give exactly one of --to and --spec")}
	case specFile != "":
		if format != "" {
			return o, usageError{fmt.Errorf("--format goes with --to (a --spec file says its format)")}
		}
		data, err := userfile.Read(specFile, userfile.MaxSpec)
		if err != nil {
			return o, err
		}
		if o.Spec, err = spec.ParseDisk(specFile, data, vm); err != nil {
			return o, err
		}
	default:
		abs, err := filepath.Abs(to)
		if err != nil {
			return o, err
		}
		o.To, o.Format = abs, format
	}
	if speed != "" {
		n, err := spec.ParseSize(speed)
		if err != nil {
			return o, usageError{fmt.Errorf("--speed: %w", err)}
		}
		o.Speed = int64(n)
	}
	return o, nil
}

// moveProgressPrinter renders a move's progress as JSON lines, a bar
// redrawn in place on a terminal, or one plain line per second otherwise.
func moveProgressPrinter(g *globals, name string, out io.Writer) func(supervisor.MoveProgress) {
	tty := isTerminal(out)
	var last time.Duration
	return func(p supervisor.MoveProgress) {
		if g.json {
			g.out.line(moveEvent{Name: name, Disk: p.Disk, Event: "progress", Progress: &p})
			return
		}
		done := 0.0
		if p.Total > 0 {
			done = float64(p.Done) / float64(p.Total)
		}
		line := fmt.Sprintf("%-9s %s of %s", p.Status, humanBytes(float64(p.Done)), humanBytes(float64(p.Total)))
		if !tty {
			if p.Elapsed-last >= time.Second || p.Status == "ready" {
				last = p.Elapsed
				fmt.Fprintf(out, "%6.1fs %s\n", p.Elapsed.Seconds(), line)
			}
			return
		}
		const width = 30
		n := int(done * width)
		fmt.Fprintf(out, "\r\x1b[K[%s%s] %3.0f%% %s", strings.Repeat("#", n), strings.Repeat(".", width-n), done*100, line)
	}
}

// moveEvent is one line of disk move --json: progress reports, then done
// (with the result) or failed (with the error).
type moveEvent struct {
	Name     string                   `json:"name"`
	Disk     string                   `json:"disk"`
	Event    string                   `json:"event"` // progress, done, failed
	Progress *supervisor.MoveProgress `json:"progress"`
	Result   *supervisor.MoveResult   `json:"result"`
	Error    *errorJSON               `json:"error"`
}
