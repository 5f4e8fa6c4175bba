package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi/enrol"
)

func remoteCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "remote",
		Short: "The API servers this client calls by name: vmsup --remote NAME ... (docs/remote-api.md)",
	}
	c.AddCommand(remoteAddCmd(g), remoteLsCmd(g), remoteRmCmd(g))
	return c
}

// remoteInfo is a remote as --json shows it (no key material).
type remoteInfo struct {
	Name     string `json:"name"`
	URL      string `json:"url"`
	Identity string `json:"identity,omitempty"`
}

func remoteAddCmd(g *globals) *cobra.Command {
	var bundle string
	c := &cobra.Command{
		Use:     "add NAME [URL] --bundle FILE",
		Short:   "Store a bundle from vmsup api cert as remote NAME (in ~/.config/vmsup/remotes): then vmsup --remote NAME ls",
		Example: "  vmsup remote add vmhost --bundle ci.bundle\n  vmsup remote add vmhost https://10.0.0.5:8443 --bundle ci.bundle",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if bundle == "" {
				return usageError{fmt.Errorf("remote add: --bundle FILE is needed (the output of vmsup api cert on the server; - for stdin)")}
			}
			data, err := readBundle(cmd, bundle)
			if err != nil {
				return err
			}
			b, err := enrol.ParseBundle(data)
			if err != nil {
				return fmt.Errorf("%s: %w", bundle, err)
			}
			if len(args) == 2 {
				b.URL = args[1]
				if _, err := enrol.ParseBundle(b.Marshal()); err != nil {
					return usageError{fmt.Errorf("remote add %s: %w", args[0], err)}
				}
			}
			rs, err := enrol.DefaultRemotes()
			if err != nil {
				return err
			}
			rem, err := rs.Add(args[0], b)
			if err != nil {
				return err
			}
			return g.out.object(remoteInfo{rem.Name, rem.URL, "cn:" + b.Name}, func(w io.Writer) {
				fmt.Fprintf(w, "remote %s: %s as cn:%s (vmsup --remote %s ...)\n", rem.Name, rem.URL, b.Name, rem.Name)
			})
		},
	}
	c.Flags().StringVar(&bundle, "bundle", "", "the bundle vmsup api cert printed (- for stdin)")
	return c
}

// readBundle reads the bundle file, or stdin for "-" (at most 1 MiB).
func readBundle(cmd *cobra.Command, p string) ([]byte, error) {
	var r io.Reader = cmd.InOrStdin()
	if p != "-" {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("remote add: --bundle: %w", err)
		}
		defer f.Close()
		r = f
	}
	return io.ReadAll(io.LimitReader(r, 1<<20))
}

func remoteLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the remotes added",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := enrol.DefaultRemotes()
			if err != nil {
				return err
			}
			list, err := rs.List()
			if err != nil {
				return err
			}
			infos := []remoteInfo{}
			for _, r := range list {
				infos = append(infos, remoteInfo{Name: r.Name, URL: r.URL})
			}
			return g.out.object(struct {
				Remotes []remoteInfo `json:"remotes"`
			}{infos}, func(w io.Writer) {
				for _, r := range infos {
					fmt.Fprintf(w, "%s\t%s\n", r.Name, r.URL)
				}
			})
		},
	}
}

func remoteRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Forget a remote (its certificate and key with it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rs, err := enrol.DefaultRemotes()
			if err != nil {
				return err
			}
			if err := rs.Remove(args[0]); err != nil {
				return err
			}
			return g.out.object(remoteInfo{Name: args[0]}, func(io.Writer) {})
		},
	}
}

// resolveRemote makes --remote NAME (no "://") the stored remote's URL and
// files; --ca, --cert and --key given as well win.
func (r *remoteFlags) resolve() error {
	if r.url == "" || strings.Contains(r.url, "://") {
		return nil
	}
	rs, err := enrol.DefaultRemotes()
	if err != nil {
		return err
	}
	rem, err := rs.Get(r.url)
	if err != nil {
		return err
	}
	r.url = rem.URL
	for _, f := range []struct {
		dst *string
		v   string
	}{{&r.ca, rem.CA}, {&r.cert, rem.Cert}, {&r.key, rem.Key}} {
		if *f.dst == "" {
			*f.dst = f.v
		}
	}
	return nil
}
