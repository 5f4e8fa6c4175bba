package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/host/userfile"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/libvirtimport"
	"github.com/vmsup/vmsup/spec"
)

// importJSON is what `vmsup import --json` prints.
type importJSON struct {
	Name    string        `json:"name"`
	Source  string        `json:"source"`
	Output  string        `json:"output"` // "" when the file is in TOML
	TOML    string        `json:"toml"`   // the VM file, without -o
	Dropped []droppedJSON `json:"dropped"`
}

type droppedJSON struct {
	Element string `json:"element"`
	Why     string `json:"why"`
}

// maxDomainXML bounds the XML read: a domain's is a few KiB.
const maxDomainXML = 4 << 20

func importCmd(g *globals) *cobra.Command {
	var output string
	var force bool
	c := &cobra.Command{
		Use:   "import DOMAIN.xml",
		Short: "Turn a libvirt domain XML into a vmsup VM file, listing what it cannot carry over",
		Long: "Turn a libvirt domain XML (virsh dumpxml NAME, or virt-install --print-xml) into a vmsup VM file.\n" +
			"Each element vmsup cannot express is listed on stderr, one line each, with why, and at the\n" +
			"head of the file. Secrets stay where libvirt keeps them (the file names them, it does not\n" +
			"copy them). A host path outside the places this host allows (--image-dir, --block-dir,\n" +
			"--config-dir, --allow-path; \"..\" and symlinks resolved) is not carried over: its disk, share\n" +
			"or kernel is listed with why. A NIC on a libvirt network goes on this host's managed network of\n" +
			"that name (vmsup network ls), clean-traffic being its anti-spoofing; else on the network's bridge.\n" +
			"DOMAIN.xml \"-\" reads standard input. The VM file is written to stdout, or to\n" +
			"FILE with -o, which must not exist unless --force is given.",
		Example: "  virsh dumpxml web > web.xml && vmsup import web.xml -o web.toml\n" +
			"  virsh dumpxml db | vmsup import - > db.toml",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readDomainXML(cmd.InOrStdin(), args[0])
			if err != nil {
				return err
			}
			// Host paths outside this host's places are not carried over.
			sup, err := g.supervisor()
			if err != nil {
				return err
			}
			defer sup.Close()
			// A NIC on a libvirt network goes on the managed network of its name.
			networks, err := sup.Networks().Names()
			if err != nil {
				return fmt.Errorf("managed networks: %w", err)
			}
			// A disk's queue mapping over I/O threads needs QEMU 9 here.
			vqMapping := false
			if c, err := sup.HostCaps(cmd.Context(), false); err == nil {
				vqMapping = c.IOThreadVQMapping()
			}
			res, err := libvirtimport.ConvertWith(data, args[0], libvirtimport.Options{CheckPath: sup.CheckPath,
				CheckDisk: func(d spec.Disk) error { return sup.CheckDisk(cmd.Context(), d) }, NoSEV: caps.SEVReason(),
				ManagedNetworks: networks, IOThreadVQMapping: vqMapping})
			if err != nil {
				return err
			}
			if output != "" {
				if _, err := os.Stat(output); err == nil && !force {
					return fmt.Errorf("%s exists: give another -o, or --force to replace it", output)
				}
				if err := atomicfile.WriteFile(output, res.TOML, 0o644); err != nil {
					return fmt.Errorf("write %s: %w", output, err)
				}
			}
			if g.json {
				out := importJSON{Name: res.Name, Source: args[0], Output: output, Dropped: []droppedJSON{}}
				if output == "" {
					out.TOML = string(res.TOML)
				}
				for _, d := range res.Dropped {
					out.Dropped = append(out.Dropped, droppedJSON{d.Element, d.Why})
				}
				return g.out.object(out, nil)
			}
			for _, d := range res.Dropped {
				fmt.Fprintf(cmd.ErrOrStderr(), "vmsup import: not carried over: %s\n", d)
			}
			if output == "" {
				_, err := cmd.OutOrStdout().Write(res.TOML)
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "vmsup import: wrote %s (vm %q, %d elements not carried over)\n", output, res.Name, len(res.Dropped))
			return nil
		},
	}
	c.Flags().StringVarP(&output, "output", "o", "", "write the VM file here instead of stdout")
	c.Flags().BoolVar(&force, "force", false, "replace an existing -o file")
	return c
}

func readDomainXML(stdin io.Reader, path string) ([]byte, error) {
	if path != "-" {
		return userfile.Read(path, maxDomainXML)
	}
	b, err := io.ReadAll(io.LimitReader(stdin, maxDomainXML+1))
	if err != nil {
		return nil, fmt.Errorf("stdin: %w", err)
	}
	if len(b) > maxDomainXML {
		return nil, errors.New("stdin: more than 4 MiB: not a domain XML")
	}
	return b, nil
}
