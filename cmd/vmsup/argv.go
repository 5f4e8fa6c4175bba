package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

func argvCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "argv FILE",
		Short: "Print the exact QEMU argv for FILE, one argument per line",
		Long: `Print the QEMU argv of the machine vmsup starts for FILE, one argument per line,
with every disk named by path (what a raw QEMU run of the same machine takes).
vmsup starts QEMU paused (-S) without its file, ISO and block device disks
outside the VM's state directory, opens their images and backing chains
itself and passes them as descriptors over QMP (/dev/fdset/N) before the
guest runs; those disks are listed on stderr (in JSON: disks_by_descriptor).
The kernel and initrd are printed by path too: vmsup opens and checks them
at each start and QEMU boots its copies in the VM's state directory
(DIR/boot/kernel, DIR/boot/initrd), as said on stderr.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withFiles(args, func(sup *supervisor.Supervisor, fs []*spec.File) error {
				argv, err := sup.Argv(fs[0])
				if err != nil {
					return err
				}
				byFD := sup.DisksByDescriptor(fs[0])
				return g.out.object(struct {
					Name string   `json:"name"`
					Argv []string `json:"argv"`
					// DisksByFD reach QEMU as descriptors over QMP, not by these paths.
					DisksByFD []string `json:"disks_by_descriptor"`
				}{fs[0].VM.Name, argv, nonNil(byFD)}, func(w io.Writer) {
					for _, a := range argv {
						fmt.Fprintln(w, a)
					}
					if len(byFD) > 0 {
						fmt.Fprintf(os.Stderr, "vmsup: disks %s reach QEMU as descriptors over QMP (/dev/fdset/N) while it waits paused (-S), not by these paths\n",
							strings.Join(byFD, ", "))
					}
					if fs[0].VM.Boot.Kernel != "" {
						fmt.Fprintln(os.Stderr, "vmsup: QEMU boots copies of the kernel and initrd in the VM's state directory (boot/), made from their checked files at each start, not these paths")
					}
				})
			})
		},
	}
}
