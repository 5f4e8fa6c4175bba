package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func apiCmd(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "api",
		Short: "The remote API: served by a socket-activated vmsup that exits when idle (docs/remote-api.md)",
	}
	c.AddCommand(apiServeCmd(g), apiUnitsCmd(g), apiInstallCmd(g), apiCertCmd(g))
	return c
}

func apiServeCmd(g *globals) *cobra.Command {
	var config string
	c := &cobra.Command{
		Use:   "serve",
		Short: "Serve the API on the sockets systemd passes (vmsup-api.socket), until idle",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := remoteapi.LoadConfig(g.apiConfig(config))
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
	c.Flags().StringVar(&config, "config", os.Getenv("VMSUP_API_CONFIG"), "the server's configuration: certificates, grants, limits (env VMSUP_API_CONFIG; default ROOT/remote/remote.toml, as api install makes it, else "+legacyAPIConfig+")")
	return c
}

func apiUnitsCmd(g *globals) *cobra.Command {
	var o remoteapi.UnitOptions
	c := &cobra.Command{
		Use:   "units",
		Short: "Print the API's systemd units (vmsup-api.socket, vmsup-api.service), with this command's global flags (api install writes them)",
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
			o.Args = g.serverArgs(cmd)
			o.Config = g.apiConfig(o.Config)
			sock, svc, err := remoteapi.Units(o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "# %s\n%s\n# %s\n%s", remoteapi.SocketUnit, sock, remoteapi.ServiceUnit, svc)
			return nil
		},
	}
	c.Flags().StringVar(&o.Listen, "listen", "0.0.0.0:8443", "TCP address for mutual TLS (\"\" for none)")
	c.Flags().StringVar(&o.Socket, "socket", "/run/vmsup/api.sock", "unix socket for local callers (\"\" for none)")
	c.Flags().StringVar(&o.Config, "config", "", "the server's configuration file (default ROOT/remote/remote.toml, else "+legacyAPIConfig+")")
	c.Flags().StringVar(&o.Self, "self", "", "the vmsup binary the service runs (default: this one)")
	return c
}

// clientOnly are the global flags that say how this command runs or talks
// to a remote host, not how the host's VMs are managed: a server's units
// do not carry them.
var clientOnly = map[string]bool{"remote": true, "ca": true, "cert": true, "key": true, "json": true, "wait": true, "help": true}

// serverArgs are the global flags, with the values this command has (from
// its flags or the environment), that a unit running vmsup for this host
// passes on: the server then manages the VMs this command would (its
// --root, QEMU, bus, places), whatever the unit's environment is.
func (g *globals) serverArgs(cmd *cobra.Command) []string {
	var args []string
	cmd.Root().PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if clientOnly[f.Name] {
			return
		}
		switch v := f.Value.(type) {
		case pflag.SliceValue:
			for _, e := range v.GetSlice() {
				args = append(args, "--"+f.Name+"="+e)
			}
		default:
			if f.Value.Type() == "bool" {
				if f.Value.String() == "true" {
					args = append(args, "--"+f.Name)
				}
			} else if f.Value.String() != "" {
				args = append(args, "--"+f.Name+"="+f.Value.String())
			}
		}
	})
	return args
}
