package main

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/remoteapi/enrol"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// apiDir is where api install keeps the API's state under the root: the
// PKI, the URL clients are given and (by default) the configuration.
func (g *globals) apiDir() string { return filepath.Join(g.root, "remote") }

// legacyAPIConfig is where the server's configuration lay before api
// install: a host set up by hand keeps it there.
const legacyAPIConfig = "/etc/vmsup/remote.toml"

// apiConfig is the server's configuration file: the flag's, else the one
// api install makes under the root, else (only where that is missing and
// the old one exists) the hand-made one, so that install, cert, units and
// serve all read one file.
func (g *globals) apiConfig(flag string) string {
	if flag != "" {
		return flag
	}
	p := filepath.Join(g.apiDir(), "remote.toml")
	if _, err := os.Stat(p); os.IsNotExist(err) {
		if _, err := os.Stat(legacyAPIConfig); err == nil {
			return legacyAPIConfig
		}
	}
	return p
}

func (g *globals) apiURLFile() string { return filepath.Join(g.apiDir(), "pki", "url") }

func apiInstallCmd(g *globals) *cobra.Command {
	var o remoteapi.UnitOptions
	var apiURL string
	var sans []string
	c := &cobra.Command{
		Use:   "install",
		Short: "Install and start the API's units with this command's global flags; make its CA and server certificate on first use",
		Example: "  vmsup api install --url https://vmhost.example:8443\n" +
			"  vmsup api cert ci --role operator --vms 'web*' > ci.bundle   # then, on the client: vmsup remote add vmhost --bundle ci.bundle",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.json {
				return usageError{fmt.Errorf("api install: it has no --json form")}
			}
			u, names, err := serverNames(apiURL, o.Listen, sans)
			if err != nil {
				return usageError{err}
			}
			pki, err := enrol.EnsurePKI(filepath.Join(g.apiDir(), "pki"), names)
			if err != nil {
				return fmt.Errorf("api install: %w", err)
			}
			o.Config = g.apiConfig(o.Config)
			made, err := enrol.EnsureConfig(o.Config, pki)
			if err != nil {
				return fmt.Errorf("api install: %s: %w", o.Config, err)
			}
			if err := os.WriteFile(g.apiURLFile(), []byte(u+"\n"), 0o644); err != nil {
				return fmt.Errorf("api install: %w", err)
			}
			if o.Self == "" {
				if o.Self, err = os.Executable(); err != nil {
					return err
				}
			}
			o.Args = g.serverArgs(cmd)
			sd, err := units.Connect(cmd.Context(), g.bus)
			if err != nil {
				return err
			}
			defer sd.Close()
			if err := enrol.InstallUnits(cmd.Context(), sd, g.unitDir, o); err != nil {
				return fmt.Errorf("api install: %w", err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s: enabled and listening (%s) in %s, serving %s\n", remoteapi.SocketUnit, strings.Join(nonEmpty(o.Listen, o.Socket), ", "), g.unitDir, g.root)
			fmt.Fprintf(w, "CA: %s; server certificate for %s\n", pki.CAFile(), strings.Join(names, ", "))
			if made {
				fmt.Fprintf(w, "config: %s (made now, no client yet): vmsup api cert NAME --role ROLE --vms GLOB adds one\n", o.Config)
			} else {
				fmt.Fprintf(w, "config: %s (kept as it was)\n", o.Config)
			}
			return nil
		},
	}
	c.Flags().StringVar(&o.Listen, "listen", "0.0.0.0:8443", "TCP address for mutual TLS (\"\" for none)")
	c.Flags().StringVar(&o.Socket, "socket", "/run/vmsup/api.sock", "unix socket for local callers (\"\" for none)")
	c.Flags().StringVar(&o.Config, "config", "", "the server's configuration file, made if missing (default ROOT/remote/remote.toml)")
	c.Flags().StringVar(&o.Self, "self", "", "the vmsup binary the service runs (default: this one)")
	c.Flags().StringVar(&apiURL, "url", "", "the URL clients reach the server at, given in their bundles (default https://HOSTNAME:PORT)")
	c.Flags().StringSliceVar(&sans, "san", nil, "another host name or IP address for the server's certificate (made once, on first install)")
	return c
}

// serverNames are the URL clients are given and the names the server's
// certificate holds: the URL's host, this host's name, loopback, the
// listening address if it is one host's, and extra.
func serverNames(apiURL, listen string, extra []string) (string, []string, error) {
	host, port, err := net.SplitHostPort(listen)
	if listen != "" && err != nil {
		return "", nil, fmt.Errorf("--listen %s: %w", listen, err)
	}
	hostname, _ := os.Hostname()
	if apiURL == "" {
		if listen == "" {
			return "", nil, fmt.Errorf("--url: needed without --listen")
		}
		apiURL = "https://" + net.JoinHostPort(hostname, port)
	}
	u, err := url.Parse(apiURL)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		return "", nil, fmt.Errorf("--url %s: want https://HOST:PORT", apiURL)
	}
	names := []string{u.Hostname(), hostname, "localhost", "127.0.0.1", "::1"}
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		names = append(names, host)
	}
	seen := map[string]bool{}
	var out []string
	for _, n := range append(names, extra...) {
		if n != "" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return apiURL, out, nil
}

// checkGrantFlags checks api cert's --role and --vms as the server will.
func checkGrantFlags(role string, vms []string) error {
	switch remoteapi.Role(role) {
	case remoteapi.ReadOnly, remoteapi.Operator, remoteapi.Admin:
	default:
		return fmt.Errorf("api cert: --role %q: want read-only, operator or admin", role)
	}
	if len(vms) == 0 {
		return fmt.Errorf("api cert: --vms: missing (name patterns such as 'web*'; '*' for every VM)")
	}
	for _, p := range vms {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return fmt.Errorf("api cert: --vms %q: not a name pattern", p)
		}
	}
	return nil
}

func nonEmpty(s ...string) []string {
	var out []string
	for _, x := range s {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}

func apiCertCmd(g *globals) *cobra.Command {
	var role, config, apiURL, out string
	var vms []string
	c := &cobra.Command{
		Use:   "cert NAME",
		Short: "Enrol a client: grant cn:NAME a role for some VMs and print its bundle (certificate, key, CA, URL) for vmsup remote add",
		Example: "  vmsup api cert ci --role operator --vms 'web*' --out ci.bundle\n" +
			"  vmsup api cert dash --role read-only --vms '*' > dash.bundle",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.json {
				return usageError{fmt.Errorf("api cert prints a bundle for vmsup remote add: it has no --json form")}
			}
			name := args[0]
			if err := spec.ValidName(name); err != nil {
				return usageError{fmt.Errorf("api cert: client %w", err)}
			}
			if err := checkGrantFlags(role, vms); err != nil {
				return usageError{err}
			}
			pki, err := enrol.OpenPKI(filepath.Join(g.apiDir(), "pki"))
			if err != nil {
				return err
			}
			if apiURL == "" {
				b, err := os.ReadFile(g.apiURLFile())
				if err != nil {
					return fmt.Errorf("api cert: no --url, and none recorded by api install (%s): %w", g.apiURLFile(), err)
				}
				apiURL = strings.TrimSpace(string(b))
			}
			cfg := g.apiConfig(config)
			grant := remoteapi.Grant{Identity: "cn:" + name, Role: remoteapi.Role(role), VMs: vms}
			added, err := enrol.AddGrant(cfg, grant)
			if err != nil {
				return err
			}
			cert, key, err := pki.IssueClient(name)
			if err != nil {
				return err
			}
			b := &enrol.Bundle{Name: name, URL: apiURL, CA: string(pki.CAPEM()), Cert: string(cert), Key: string(key)}
			note := "granted"
			if !added {
				note = "already granted"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "cn:%s: %s %s for %s in %s\n", name, note, role, strings.Join(vms, ", "), cfg)
			if out == "" {
				_, err = cmd.OutOrStdout().Write(b.Marshal())
				return err
			}
			// O_EXCL: a bundle holds a key; never write it through a file someone else made.
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("api cert: --out: %w", err)
			}
			if _, err := f.Write(b.Marshal()); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		},
	}
	c.Flags().StringVar(&role, "role", "", "read-only, operator or admin (docs/remote-api.md)")
	c.Flags().StringSliceVar(&vms, "vms", nil, "the VMs the role is for: name patterns ('web*'; '*' for all)")
	c.Flags().StringVar(&config, "config", "", "the server's configuration file (default ROOT/remote/remote.toml)")
	c.Flags().StringVar(&apiURL, "url", "", "the server's URL in the bundle (default: the one api install recorded)")
	c.Flags().StringVar(&out, "out", "", "write the bundle to this new file (0600) instead of stdout")
	return c
}
