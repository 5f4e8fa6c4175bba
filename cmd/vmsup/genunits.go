package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// genUnitsCmd writes the persistent units vmsup installs by command (enable,
// metrics --install, api install) into a directory, rendered by the same
// code with this command's global flags and installed nowhere: the Debian
// package ships them disabled (scripts/build-deb.sh).
func genUnitsCmd(g *globals) *cobra.Command {
	var self, metricsListen string
	var api remoteapi.UnitOptions
	c := &cobra.Command{
		Use:    "gen-units DIR",
		Short:  "Write the units vmsup enable, metrics --install and api install write, into DIR (not enabled)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g.self = self
			files := map[string][]byte{}
			err := g.with(func(sup *supervisor.Supervisor) error {
				f, err := sup.UnitFiles(metricsListen)
				files = f
				return err
			})
			if err != nil {
				return err
			}
			api.Self, api.Args, api.Config = self, g.serverArgs(cmd), g.apiConfig("")
			sock, svc, err := remoteapi.Units(api)
			if err != nil {
				return err
			}
			files[remoteapi.SocketUnit], files[remoteapi.ServiceUnit] = []byte(sock), []byte(svc)
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			names := make([]string, 0, len(files))
			for name := range files {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				p := filepath.Join(args[0], name)
				if err := os.WriteFile(p, files[name], 0o644); err != nil {
					return fmt.Errorf("gen-units: %w", err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), p)
			}
			return nil
		},
	}
	c.Flags().StringVar(&self, "self", "/usr/bin/vmsup", "the vmsup binary the units run")
	c.Flags().StringVar(&metricsListen, "metrics-listen", "127.0.0.1:9475", "the metrics endpoint's address")
	c.Flags().StringVar(&api.Listen, "api-listen", "0.0.0.0:8443", "the API's TCP address for mutual TLS")
	c.Flags().StringVar(&api.Socket, "api-socket", "/run/vmsup/api.sock", "the API's unix socket")
	return c
}
