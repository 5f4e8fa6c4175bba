package main

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func snapshotCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "snapshot",
		Short: "Take, list, revert to and remove a VM's snapshots (external qcow2 overlays, optionally with memory)",
	}
	c.AddCommand(snapshotCreateCmd(g), snapshotLsCmd(g), snapshotRevertCmd(g), snapshotRmCmd(g))
	return c
}

func snapshotCreateCmd(g *globals) *cobra.Command {
	var o supervisor.SnapshotOptions
	c := &cobra.Command{
		Use:   "create NAME TAG",
		Short: "Snapshot every writable disk of a VM at one moment (the guest's filesystems frozen by its agent if it has one); --memory keeps its RAM too",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				o.Progress = snapshotProgress(g, cmd.ErrOrStderr(), name, "memory")
				r, err := sup.Snapshot(cmd.Context(), name, args[1], o)
				endBar(cmd.ErrOrStderr())
				note := ""
				if err == nil {
					note = fmt.Sprintf("snapshot %s: disks %s; %s", r.Tag, strings.Join(r.Disks, ", "), r.Quiesced)
					if r.Live {
						note += fmt.Sprintf("; guest paused %s", r.Pause.Round(100*1e3))
					}
					if r.Memory != "" {
						note += "; with memory"
					}
				}
				return snapshotDone(g, cmd.OutOrStdout(), name, note, err)
			})
		},
	}
	c.Flags().BoolVar(&o.Memory, "memory", false, "also save the guest's RAM and device state (a revert resumes it)")
	return c
}

func snapshotRevertCmd(g *globals) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "revert NAME TAG",
		Short: "Put a VM's disks back to a snapshot (the writes since are dropped); with a memory snapshot the guest resumes where it was",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				r, err := sup.RevertSnapshot(cmd.Context(), name, args[1], force)
				if err != nil {
					return err
				}
				state, note := "stopped", "reverted to "+r.Tag
				if r.Started {
					state = "running"
				}
				if r.Restored {
					note += " (resumed from its memory)"
				}
				g.out.action(actionJSON{Name: name, File: fileOf(args[0]), Action: "reverted", State: state, Note: note}, name+": "+note)
				return nil
			})
		},
	}
	c.Flags().BoolVar(&force, "force", false, "revert a running VM (it is stopped first and loses its state since)")
	return c
}

func snapshotRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME TAG",
		Short: "Remove a snapshot, merging its data into the images around it (live with block-commit while the VM runs)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				show := snapshotProgress(g, cmd.ErrOrStderr(), name, "merge")
				var progress func(string, int64, int64)
				if show != nil {
					progress = func(disk string, done, total int64) { show(done, total) }
				}
				err := sup.RemoveSnapshot(cmd.Context(), name, args[1], progress)
				endBar(cmd.ErrOrStderr())
				return snapshotDone(g, cmd.OutOrStdout(), name, "snapshot "+args[1]+" removed", err)
			})
		},
	}
}

func snapshotLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls NAME",
		Short: "List a VM's snapshots, as a tree, and the images its disks run on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				tree, err := sup.SnapshotTree(name)
				if err != nil {
					return err
				}
				return g.out.object(tree, func(w io.Writer) { printSnapshots(w, tree) })
			})
		},
	}
}

// pairs are a map of images as "disk=image", sorted.
func pairs(m map[string]snapshottree.Image) []string {
	out := []string{}
	for k, v := range m {
		out = append(out, k+"="+v.Path)
	}
	sort.Strings(out)
	return out
}

func printSnapshots(w io.Writer, t *supervisor.SnapshotTree) {
	if len(t.Snapshots) == 0 {
		fmt.Fprintf(w, "%s: no snapshots\n", t.Name)
		return
	}
	depth := map[string]int{}
	for _, sn := range t.Snapshots {
		d := 0
		if sn.Parent != "" {
			d = depth[sn.Parent] + 1
		}
		depth[sn.Tag] = d
		mark := " "
		if sn.Tag == t.Current {
			mark = "*"
		}
		mem := ""
		if sn.Memory != "" {
			mem = ", memory"
		}
		fmt.Fprintf(w, "%s %s%s  %s (%s%s)\n", mark, strings.Repeat("  ", d), sn.Tag, sn.Created.UTC().Format("2006-01-02T15:04:05Z"), sn.Quiesced, mem)
	}
	for _, a := range pairs(t.Active) {
		fmt.Fprintf(w, "  runs on %s\n", a)
	}
}

// bar is a progress bar redrawn in place on a terminal (nil elsewhere:
// --json and logs get the result only).
func bar(out io.Writer, label string) func(done, total int64) {
	if !isTerminal(out) {
		return nil
	}
	return func(done, total int64) {
		f := 0.0
		if total > 0 {
			f = float64(done) / float64(total)
		}
		const width = 30
		n := min(int(f*width), width)
		fmt.Fprintf(out, "\r\x1b[K%s [%s%s] %3.0f%% %s of %s", label, strings.Repeat("#", n), strings.Repeat(".", width-n),
			f*100, humanBytes(float64(done)), humanBytes(float64(total)))
	}
}

func endBar(out io.Writer) {
	if isTerminal(out) {
		fmt.Fprint(out, "\r\x1b[K")
	}
}

// snapshotEvent is one line of snapshot create/rm --json: progress of a
// long step (a memory save, a live merge), then done or failed.
type snapshotEvent struct {
	Name     string            `json:"name"`
	Event    string            `json:"event"`
	Progress *snapshotProgJSON `json:"progress"`
	Note     string            `json:"note"`
	Error    *errorJSON        `json:"error"`
}

type snapshotProgJSON struct {
	Step  string `json:"step"` // "memory" or "merge"
	Done  int64  `json:"done_bytes"`
	Total int64  `json:"total_bytes"`
}

// snapshotProgress reports a long step: --json lines, a bar on a
// terminal, nothing otherwise.
func snapshotProgress(g *globals, tty io.Writer, name, step string) func(done, total int64) {
	if g.json {
		return func(done, total int64) {
			g.out.line(snapshotEvent{Name: name, Event: "progress", Progress: &snapshotProgJSON{step, done, total}})
		}
	}
	return bar(tty, step)
}

// snapshotDone prints the outcome: a done or failed line with --json, the
// note otherwise.
func snapshotDone(g *globals, out io.Writer, name, note string, err error) error {
	if g.json {
		ev := snapshotEvent{Name: name, Event: "done", Note: note}
		if err != nil {
			ev = snapshotEvent{Name: name, Event: "failed", Error: toErrorJSON(err)}
		}
		g.out.line(ev)
		return err
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, name+": "+note)
	return nil
}
