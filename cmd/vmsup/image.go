package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// imageStore is the image store of the state root the flags name; its
// users are looked for in the image directories too (a removed VM's disk).
func (g *globals) imageStore() imagestore.Store {
	dirs := g.imageDirs
	if len(dirs) == 0 {
		dirs = []string{filepath.Join(g.root, "images")}
	}
	return imagestore.Store{Dir: imagestore.Dir(g.root), ScanDirs: dirs}
}

// imageUsers finds the VMs of the state root that use stored images.
func (g *globals) imageUsers() imagestore.UsersFunc {
	return g.imageStore().Users(vmstore.Store{Root: g.root})
}

func imageCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "image",
		Short: "Pull, list and remove the disk images VM disks are made on (image = \"ALIAS\")",
		Long: "The image store holds disk images pulled from HTTP(S) URLs or OCI registries, verified and kept\n" +
			"by the sha256 of their file under ROOT/image-store, read-only. A VM file's disk with\n" +
			"image = \"ALIAS\" (or \"sha256:HEX\") gets its file made as a qcow2 overlay on it at its first up.",
		Example: "  vmsup image pull https://example.org/debian-12.qcow2 --sha512 HEX --name debian-12\n  vmsup image ls\n  vmsup image rm debian-12",
	}
	c.AddCommand(imagePullCmd(g), imageLsCmd(g), imageRmCmd(g), imagePruneCmd(g))
	return c
}

func imagePullCmd(g *globals) *cobra.Command {
	var p imagestore.Pull
	maxSize := "4T"
	c := &cobra.Command{
		Use:   "pull SOURCE",
		Short: "Fetch an image from an HTTP(S) URL (with its checksum) or an OCI registry (a containerDisk)",
		Example: "  vmsup image pull https://example.org/debian-12.qcow2 --sha512 HEX --name debian-12\n" +
			"  vmsup image pull https://example.org/debian-12.qcow2 --sums https://example.org/SHA256SUMS --name debian-12\n" +
			"  vmsup image pull quay.io/containerdisks/debian:12 --name debian-12",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Source = args[0]
			bound, err := spec.ParseSize(maxSize)
			if err == nil && bound <= 0 {
				err = errors.New("want a size above 0, such as \"4T\"")
			}
			if err != nil {
				return usageError{fmt.Errorf("--max-virtual-size %s: %w", maxSize, err)}
			}
			p.Progress = pullProgress(g, cmd.ErrOrStderr())
			st := g.imageStore()
			st.MaxVirtualSize = int64(bound)
			im, err := st.Pull(cmd.Context(), p)
			if isTerminal(cmd.ErrOrStderr()) && !g.json {
				fmt.Fprintln(cmd.ErrOrStderr())
			}
			if err != nil {
				return err
			}
			return g.out.object(im, func(w io.Writer) {
				fmt.Fprintf(w, "%s %s %s (%s virtual)%s\n", im.Digest, im.Format, humanBytes(float64(im.Size)),
					humanBytes(float64(im.VirtualSize)), aliasNote(im.Aliases))
			})
		},
	}
	f := c.Flags()
	f.StringVar(&p.Name, "name", "", "alias to give the image (what a disk's image key names)")
	f.StringVar(&p.SHA256, "sha256", "", "the file's sha256 (hex): an HTTP pull is refused unless it matches")
	f.StringVar(&p.SHA512, "sha512", "", "the file's sha512 (hex)")
	f.StringVar(&p.SumsURL, "sums", "", "URL of a SHA256SUMS file naming the URL's file")
	f.BoolVar(&p.Insecure, "insecure", false, "reach the OCI registry over plain HTTP")
	f.StringVar(&maxSize, "max-virtual-size", maxSize, "refuse an image whose virtual size (from its header) is larger")
	return c
}

func aliasNote(aliases []string) string {
	if len(aliases) == 0 {
		return ""
	}
	return " as " + strings.Join(aliases, ", ")
}

// pullProgress redraws a line on a terminal, writes JSON lines with
// --json, and says nothing otherwise.
func pullProgress(g *globals, out io.Writer) func(imagestore.Progress) {
	tty := isTerminal(out)
	return func(p imagestore.Progress) {
		switch {
		case g.json:
			g.out.line(p)
		case tty && p.Phase == "download" && p.Total > 0:
			const width = 30
			n := int(float64(p.Done) / float64(p.Total) * width)
			fmt.Fprintf(out, "\r\x1b[K[%s%s] %s of %s", strings.Repeat("#", n), strings.Repeat(".", width-n),
				humanBytes(float64(p.Done)), humanBytes(float64(p.Total)))
		case tty:
			fmt.Fprintf(out, "\r\x1b[K%s %s", p.Phase, humanBytes(float64(p.Done)))
		}
	}
}

func imageLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Short:   "List stored images with their aliases and the VMs using them",
		Example: "  vmsup image ls\n  vmsup --json image ls",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ims, err := g.imageStore().List()
			if err != nil {
				return err
			}
			users, err := g.imageUsers()(cmd.Context())
			if err != nil {
				return err
			}
			type row struct {
				imagestore.Image
				UsedBy []string `json:"used_by"`
			}
			rows := []row{}
			for _, im := range ims {
				rows = append(rows, row{im, append([]string{}, users[im.Path]...)})
			}
			return g.out.object(rows, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "DIGEST\tALIASES\tFORMAT\tSIZE\tVIRTUAL\tUSERS\tSOURCE")
				for _, r := range rows {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Digest[:19], dash(strings.Join(r.Aliases, ",")), r.Format,
						humanBytes(float64(r.Size)), humanBytes(float64(r.VirtualSize)), len(r.UsedBy), r.Source)
				}
				tw.Flush()
			})
		},
	}
}

func imageRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ALIAS|DIGEST...",
		Short:   "Remove an alias, or an image no VM uses (refused, naming them, when one does)",
		Example: "  vmsup image rm debian-12\n  vmsup image rm sha256:HEX",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, ref := range args {
				removed, err := g.imageStore().Remove(cmd.Context(), ref, g.imageUsers())
				if err != nil {
					return err
				}
				g.out.action(actionJSON{Name: ref, Action: "removed"}, "removed "+strings.Join(removed, ", "))
			}
			return nil
		},
	}
}

func imagePruneCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "prune",
		Short:   "Remove the images no alias names and no VM uses, and stale partial downloads",
		Example: "  vmsup image prune",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			pr, err := g.imageStore().Prune(cmd.Context(), g.imageUsers())
			g.out.acting = true // --json: [] when nothing went
			for _, im := range pr.Removed {
				g.out.action(actionJSON{Name: im.Digest, Action: "removed"},
					fmt.Sprintf("removed %s (%s, %s)", im.Digest, im.Source, humanBytes(float64(im.Size))))
			}
			for _, p := range pr.Partials {
				g.out.action(actionJSON{Name: p, Action: "removed"}, "removed "+p+" (no pull was working on it)")
			}
			if !g.json {
				printPruneKept(cmd.OutOrStdout(), pr)
			}
			return err
		},
	}
}

// printPruneKept ends prune's text: the images it kept and why, and the
// space it freed (or that it removed nothing).
func printPruneKept(w io.Writer, pr imagestore.Pruned) {
	for _, k := range pr.Kept {
		var why []string
		if len(k.Aliases) > 0 {
			why = append(why, "alias "+strings.Join(k.Aliases, ", "))
		}
		if len(k.UsedBy) > 0 {
			why = append(why, "used by "+strings.Join(k.UsedBy, ", "))
		}
		fmt.Fprintf(w, "kept %s (%s)\n", k.Digest, strings.Join(why, "; "))
	}
	if len(pr.Removed)+len(pr.Partials) == 0 {
		fmt.Fprintf(w, "nothing to remove: %d image(s) kept (named by an alias or used by a VM)\n", len(pr.Kept))
		return
	}
	fmt.Fprintf(w, "freed %s; %d image(s) kept\n", humanBytes(float64(pr.Freed())), len(pr.Kept))
}
