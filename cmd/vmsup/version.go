package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// buildVersion, when the build sets it (-ldflags -X main.buildVersion=V,
// as scripts/build-deb.sh does with the package's version), is vmsup's
// version.
var buildVersion string

// version is vmsup's own version: buildVersion, the module version, or the
// VCS revision it was built from.
func version() string {
	if buildVersion != "" {
		return buildVersion
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if v == "" || v == "(devel)" {
		if rev == "" {
			return "devel"
		}
		return "devel " + rev[:min(12, len(rev))] + dirty
	}
	return strings.TrimSpace(v + " " + dirty)
}

// printVersion writes vmsup's version and those of the QEMU and systemd it
// uses (their first lines of --version).
func printVersion(w io.Writer, qemu string) { versions(qemu).print(w) }

func (v versionJSON) print(w io.Writer) {
	fmt.Fprintf(w, "vmsup %s\n%s\n%s\n", v.Vmsup, v.QEMU, v.Systemd)
}

type versionJSON struct {
	Vmsup   string `json:"vmsup"`
	QEMU    string `json:"qemu"`
	Systemd string `json:"systemd"`
}

func versions(qemu string) versionJSON {
	first := func(c ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, c[0], c[1:]...).Output()
		if err != nil {
			return c[0] + ": " + err.Error()
		}
		line, _, _ := strings.Cut(string(out), "\n")
		return strings.TrimSpace(line)
	}
	return versionJSON{Vmsup: version(), QEMU: first(qemu, "--version"), Systemd: first("systemctl", "--version")}
}

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print vmsup's version and those of the QEMU and systemd it uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := versions(g.qemu)
			return g.out.object(v, v.print)
		},
	}
}

// manCmd writes the man pages of the command tree (make man).
func manCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "gen-man DIR",
		Short:  "Write man pages for every command into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			root.DisableAutoGenTag = true
			return doc.GenManTree(root, &doc.GenManHeader{Title: "VMSUP", Section: "1", Source: "vmsup " + version()}, args[0])
		},
	}
}
