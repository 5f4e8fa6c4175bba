package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/internal/host/userfile"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// diskCmd is `vmsup disk attach|detach|move|ls`: disk hotplug and live moves on a running VM.
func diskCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "disk",
		Short: "Hot-plug, hot-unplug and live-move disks of a running VM",
	}
	c.AddCommand(diskAttachCmd(g), diskDetachCmd(g), diskMoveCmd(g), diskLsCmd(g))
	return c
}

func diskAttachCmd(g *globals) *cobra.Command {
	var (
		specFile, file, name, format, size, backing, serial, cache string
		readOnly                                                   bool
	)
	c := &cobra.Command{
		Use:   "attach NAME (--file IMAGE | --spec DISK.toml)",
		Short: "Hot-plug a disk into a running VM (recorded: status shows it, the next up boots with it)",
		Long: `Hot-plug a disk into a running VM. --file IMAGE attaches an image file (created
with --size, or as an overlay on --backing, if it does not exist); --spec takes a
TOML file with the keys of one [[disk]] table (any disk type: file, block, iso,
seed, iscsi, rbd) at top level.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, vm string) error {
				var d *spec.Disk
				switch {
				case (specFile == "") == (file == ""):
					return usageError{fmt.Errorf("give exactly one of --file and --spec")}
				case specFile != "":
					data, err := userfile.Read(specFile, userfile.MaxSpec)
					if err != nil {
						return err
					}
					if d, err = spec.ParseDisk(specFile, data, vm); err != nil {
						return err
					}
				default:
					abs, err := filepath.Abs(file)
					if err != nil {
						return err
					}
					if name == "" {
						name = strings.TrimSuffix(filepath.Base(abs), filepath.Ext(abs))
					}
					fd := spec.Disk{Name: name, File: abs, Format: format, ReadOnly: readOnly, Serial: serial, Cache: cache}
					if backing != "" {
						if fd.Backing, err = filepath.Abs(backing); err != nil {
							return err
						}
					}
					if size != "" {
						if fd.Size, err = spec.ParseSize(size); err != nil {
							return usageError{fmt.Errorf("--size: %w", err)}
						}
					}
					if d, err = spec.CheckDisk("--file", fd, vm); err != nil {
						return err
					}
				}
				res, err := sup.AttachDisk(cmd.Context(), vm, *d)
				if err != nil {
					return err
				}
				if res.Bus == "" {
					g.out.action(actionJSON{Name: res.VM, File: fileOf(args[0]), Action: "recorded", State: stateJSON(supervisor.StateShutOff),
						Note: "disk " + res.Disk + ": the next up boots with it"},
						fmt.Sprintf("%s: disk %s recorded (%s); the VM is shut off, its next up boots with it", res.VM, res.Disk, d.Type))
					return nil
				}
				g.out.action(actionJSON{Name: res.VM, File: fileOf(args[0]), Action: "attached", State: "running", Note: "disk " + res.Disk + " on " + res.Bus},
					fmt.Sprintf("%s: disk %s attached (%s on %s)", res.VM, res.Disk, d.Type, res.Bus))
				return nil
			})
		},
	}
	f := c.Flags()
	f.StringVar(&specFile, "spec", "", "TOML file describing the disk (keys of a [[disk]] table)")
	f.StringVar(&file, "file", "", "image file to attach")
	f.StringVar(&name, "name", "", "disk name (default: the file name without extension)")
	f.StringVar(&format, "format", "", "qcow2 or raw (default from the extension)")
	f.StringVar(&size, "size", "", "create the image with this size if it does not exist (e.g. 1G)")
	f.StringVar(&backing, "backing", "", "create the image as a qcow2 overlay on this base if it does not exist")
	f.StringVar(&serial, "serial", "", "guest-visible serial")
	f.StringVar(&cache, "cache", "", "cache mode (default writeback)")
	f.BoolVar(&readOnly, "read-only", false, "attach read-only")
	return c
}

func diskDetachCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "detach NAME DISK",
		Short: "Hot-unplug a disk added with disk attach (waits for the guest to release it)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, vm string) error {
				if err := sup.DetachDisk(cmd.Context(), vm, args[1]); err != nil {
					return err
				}
				g.out.action(actionJSON{Name: vm, File: fileOf(args[0]), Action: "detached", Note: "disk " + args[1]}, fmt.Sprintf("%s: disk %s detached", vm, args[1]))
				return nil
			})
		},
	}
}
