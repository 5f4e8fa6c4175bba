package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func apiCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "api",
		Short: "The remote API: served by a socket-activated vmsup that exits when idle (docs/remote-api.md)",
	}
	c.AddCommand(apiServeCmd(g), apiUnitsCmd(g))
	return c
}

func apiServeCmd(g *globals) *cobra.Command {
	var config string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Serve the API on the sockets systemd passes (vmsup-api.socket), until idle",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := remoteapi.LoadConfig(config)
			if err != nil {
				return err
			}
			ls, err := activation.Listeners()
			if err != nil {
				return fmt.Errorf("vmsup api serve: %w", err)
			}
			return g.with(func(sup *supervisor.Supervisor) error {
				level := slog.LevelInfo
				if g.verbose {
					level = slog.LevelDebug
				}
				srv := &remoteapi.Server{Ops: sup, Config: cfg, Root: g.root,
					Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))}
				return srv.Serve(cmd.Context(), ls)
			})
		},
	}
	c.Flags().StringVar(&config, "config", envOr("VMSUP_API_CONFIG", "/etc/vmsup/remote.toml"), "the server's configuration: certificates, grants, limits (env VMSUP_API_CONFIG)")
	return c
}

func apiUnitsCmd(g *globals) *cobra.Command {
	var o remoteapi.UnitOptions
	c := &cobra.Command{
		Use:   "units",
		Short: "Print the API's systemd units (vmsup-api.socket, vmsup-api.service) to install",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.json {
				return usageError{fmt.Errorf("api units prints unit files: it has no --json form")}
			}
			if o.Self == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				o.Self = exe
			}
			sock, svc := remoteapi.Units(o)
			fmt.Fprintf(cmd.OutOrStdout(), "# %s\n%s\n# %s\n%s", remoteapi.SocketUnit, sock, remoteapi.ServiceUnit, svc)
			return nil
		},
	}
	c.Flags().StringVar(&o.Listen, "listen", "0.0.0.0:8443", "TCP address for mutual TLS (\"\" for none)")
	c.Flags().StringVar(&o.Socket, "socket", "/run/vmsup/api.sock", "unix socket for local callers (\"\" for none)")
	c.Flags().StringVar(&o.Config, "config", "/etc/vmsup/remote.toml", "the server's configuration file")
	c.Flags().StringVar(&o.Self, "self", "", "the vmsup binary the service runs (default: this one)")
	return c
}
