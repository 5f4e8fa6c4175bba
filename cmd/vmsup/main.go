// Command vmsup runs QEMU virtual machines described by TOML files as
// transient systemd units and controls them over QMP. It is a thin layer
// over package supervisor: it parses flags and prints.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// globals are the flags every command shares.
type globals struct {
	root, bus, journal, qemu string
	ovsdb                    string
	wait, verbose            bool
	qemuUser, analyze        string
	imageDirs, blockDirs     []string
	configDirs, allowPaths   []string
	unitDir, bootTarget      string
	runDir                   string
	hostCache                string
	self                     string // the binary units run; "" = this one (gen-units sets it)
	json                     bool
	out                      *output
	rem                      remoteFlags
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == supervisor.HookConsoleLog {
		// Before anything else: it runs beside every QEMU, its memory counts.
		code, _ := supervisor.HandleHook(args)
		return code
	}
	// SIGHUP too: a dropped ssh session must cancel a command as cleanly as
	// Ctrl-C does, not kill it between two steps.
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	go func() {
		// A command undoes what it made when cancelled; one that takes
		// longer than that (or a second signal) ends at once, and its
		// journal and the guardian settle the rest.
		<-ctx.Done()
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		select {
		case <-again:
		case <-time.After(cancelGrace):
		}
		fmt.Fprintln(os.Stderr, "vmsup: interrupted")
		os.Exit(exitInterrupted)
	}()
	if len(args) == 1 && args[0] == "--version" {
		printVersion(os.Stdout, envOr("VMSUP_QEMU", "/usr/bin/qemu-system-x86_64"))
		return 0
	}
	root, g := newRoot()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	g.out.json = g.out.json || slices.Contains(args, "--json") // a flag error comes before parsing
	if g.out.finish(err) || err == nil {
		return exitCode(err)
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code // the guest command's: its own output said why
	}
	printErr(os.Stderr, err)
	return exitCode(err)
}

// Exit codes, documented in the root command's help and the README.
const (
	exitFailed     = 1 // anything else
	exitUsage      = 2 // bad flags or arguments
	exitNotFound   = 3 // no VM of that name
	exitBusy       = 4 // another vmsup command holds the VM
	exitNotRunning = 5 // the VM exists but its QEMU does not run
	// exitInterrupted: Ctrl-C or SIGTERM ended the command; its error says
	// what state it left (as the shell's 128+SIGINT).
	exitInterrupted = 130
)

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var re *remoteapi.Error
	if errors.As(err, &re) && re.ExitCode != 0 {
		return re.ExitCode // --remote: the server's code for its kind, as the CLI there exits
	}
	var ue usageError
	var be *supervisor.BusyError
	switch {
	case errors.As(err, &ue), strings.HasPrefix(err.Error(), "unknown command "):
		return exitUsage
	case errors.Is(err, supervisor.ErrNotFound):
		return exitNotFound
	case errors.As(err, &be):
		return exitBusy
	case errors.Is(err, supervisor.ErrNotRunning):
		return exitNotRunning
	case errors.Is(err, supervisor.ErrInterrupted):
		return exitInterrupted
	}
	return exitFailed
}

type usageError struct{ error }

// cancelGrace bounds the undo of a cancelled command.
const cancelGrace = 10 * time.Second

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func newRoot() (*cobra.Command, *globals) {
	g := &globals{}
	g.out = &output{w: os.Stdout}
	root := &cobra.Command{
		Use:   "vmsup",
		Short: "Run QEMU VMs from TOML files as systemd units, controlled over QMP",
		Long: "Run QEMU VMs from TOML files as systemd units, controlled over QMP.\n\n" +
			"Exit codes: 0 done, 1 failed, 2 usage (bad flags or arguments), 3 no such VM,\n" +
			"4 busy (another vmsup command holds the VM), 5 the VM is not running,\n" +
			"130 interrupted (Ctrl-C; the error says what state the command left).",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.root, "root", envOr("VMSUP_ROOT", "/var/lib/vmsup"), "state directory root (env VMSUP_ROOT)")
	pf.StringVar(&g.bus, "systemd-bus", os.Getenv("VMSUP_SYSTEMD_BUS"), "D-Bus address of the systemd running VM units; empty = system bus (env VMSUP_SYSTEMD_BUS)")
	pf.StringVar(&g.journal, "journal-dir", os.Getenv("VMSUP_JOURNAL_DIR"), "journal directory of that systemd, if not the host's (env VMSUP_JOURNAL_DIR)")
	pf.StringVar(&g.qemu, "qemu", envOr("VMSUP_QEMU", "/usr/bin/qemu-system-x86_64"), "QEMU binary (env VMSUP_QEMU)")
	pf.StringVar(&g.ovsdb, "ovsdb", os.Getenv("VMSUP_OVSDB"), "OVSDB server for ovs NICs, e.g. unix:/run/openvswitch/db.sock; empty = ovs-vsctl's default (env VMSUP_OVSDB)")
	pf.BoolVar(&g.wait, "wait", false, "wait for a busy VM instead of failing")
	pf.StringVar(&g.qemuUser, "qemu-user", envOr("VMSUP_QEMU_USER", "per-vm"), "unprivileged user QEMU runs as, created if missing: \"per-vm\" (default) gives each VM its own, a user name (e.g. vmsup-qemu) runs all VMs as that one (env VMSUP_QEMU_USER)")
	pf.StringSliceVar(&g.imageDirs, "image-dir", filepath.SplitList(os.Getenv("VMSUP_IMAGE_DIRS")), "image directory: where VM files' images, kernels, seeds' files and shares may lie, hot-plugged disks go, and the only place for disks with security.apparmor = \"required\"; default ROOT/images (env VMSUP_IMAGE_DIRS, colon-separated)")
	pf.StringSliceVar(&g.blockDirs, "block-dir", filepath.SplitList(envOr("VMSUP_BLOCK_DIRS", places.DefaultBlockDirs)), "directory whose entries VM files may name as block devices (env VMSUP_BLOCK_DIRS, colon-separated)")
	pf.StringSliceVar(&g.configDirs, "config-dir", filepath.SplitList(envOr("VMSUP_CONFIG_DIRS", places.DefaultConfigDirs)), "where VM files' ceph_conf, secret_file and cni_config may lie (env VMSUP_CONFIG_DIRS, colon-separated)")
	pf.StringSliceVar(&g.allowPaths, "allow-path", filepath.SplitList(envOr("VMSUP_ALLOW_PATHS", places.DefaultAllowPaths)), "another directory (or file) VM files may name for any path key (env VMSUP_ALLOW_PATHS, colon-separated)")
	pf.StringVar(&g.analyze, "systemd-analyze", os.Getenv("VMSUP_SYSTEMD_ANALYZE"), "systemd-analyze command status uses for the exposure figure, split at spaces (env VMSUP_SYSTEMD_ANALYZE)")
	pf.StringVar(&g.unitDir, "unit-dir", envOr("VMSUP_UNIT_DIR", "/etc/systemd/system"), "where vmsup enable installs the boot unit (env VMSUP_UNIT_DIR)")
	pf.StringVar(&g.bootTarget, "boot-target", envOr("VMSUP_BOOT_TARGET", "multi-user.target"), "target that pulls the boot unit in (env VMSUP_BOOT_TARGET)")
	pf.StringVar(&g.runDir, "run-dir", envOr("VMSUP_RUN_DIR", "/run/vmsup"), "per-boot state: which VMs autostart already started (env VMSUP_RUN_DIR)")
	pf.StringVar(&g.hostCache, "host-cache", os.Getenv("VMSUP_HOST_CACHE"), "where the host probe's record is kept; default ROOT/cache/hostcaps.json (env VMSUP_HOST_CACHE)")
	pf.BoolVarP(&g.verbose, "verbose", "v", false, "log what vmsup does to stderr")
	pf.BoolVar(&g.json, "json", false, "print one JSON document (keys in docs/cli-json.md), errors too")
	root.AddCommand(
		upCmd(g), downCmd(g), lsCmd(g), statusCmd(g), pauseCmd(g), resumeCmd(g),
		argvCmd(g), validateCmd(g), qmpCmd(g), consoleCmd(g), vncCmd(g), screenshotCmd(g), stopHookCmd(g), profileCmd(g),
		nicCmd(g), hostdevCmd(g), snapshotCmd(g), backupCmd(g), restoreCmd(g), stopPostCmd(g), diskCmd(g), migrateCmd(g), moveCmd(g), migrateReceiveCmd(g),
		enableCmd(g), disableCmd(g), autostartCmd(g), setCmd(g), pingCmd(g), rmCmd(g), hostCmd(g),
		settleCmd(g), rebootApplyCmd(g), planCmd(g), applyCmd(g), eventsCmd(g), restartCmd(g), rebootCmd(g), resetCmd(g), killCmd(g),
		execCmd(g), cpCmd(g), exportCmd(g), logsCmd(g), statsCmd(g), topCmd(g), metricsCmd(g), importCmd(g), versionCmd(g), manCmd(), genUnitsCmd(g),
		fleetCmd(g), agentCmd(g), imageCmd(g), apiCmd(g), remoteCmd(g), networkCmd(g),
	)
	addRemoteFlags(root, g)
	usageArgs(root)
	completions(g, root)
	root.SetUsageTemplate(usageTemplate)
	root.InitDefaultCompletionCmd()
	addExamples(root)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		g.out.json, g.out.w = g.json, cmd.OutOrStdout()
		g.rem.cmdPath = cmd.CommandPath()
		return g.checkRemote()
	}
	return root, g
}

// usageArgs makes a wrong argument count a usage error (exit 2), like a bad flag.
func usageArgs(c *cobra.Command) {
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		usageArgs(sub)
	}
}

func (g *globals) supervisor() (*supervisor.Supervisor, error) {
	if g.rem.url != "" {
		return nil, g.notRemote()
	}
	level := slog.LevelWarn
	if g.verbose {
		level = slog.LevelDebug
	}
	return supervisor.New(supervisor.Options{
		Root:           g.root,
		SystemdBus:     g.bus,
		JournalDir:     g.journal,
		QEMU:           g.qemu,
		WaitForLock:    g.wait,
		QEMUUser:       g.qemuUser,
		ImageDirs:      g.imageDirs,
		BlockDirs:      g.blockDirs,
		ConfigDirs:     g.configDirs,
		AllowPaths:     g.allowPaths,
		UnitDir:        g.unitDir,
		BootTarget:     g.bootTarget,
		RunDir:         g.runDir,
		HostCapsCache:  g.hostCache,
		Self:           g.self,
		SystemdAnalyze: strings.Fields(g.analyze),
		Network:        supervisor.NetworkOptions{OVSDB: g.ovsdb},
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	})
}

// with runs fn with a supervisor made from the flags and closes it after.
func (g *globals) with(fn func(*supervisor.Supervisor) error) error {
	sup, err := g.supervisor()
	if err != nil {
		return err
	}
	defer sup.Close()
	return fn(sup)
}

// withVM is with for a command on one VM, given by name or by its file.
func (g *globals) withVM(arg string, fn func(sup *supervisor.Supervisor, name string) error) error {
	name, err := vmName(arg)
	if err != nil {
		return err
	}
	return g.with(func(sup *supervisor.Supervisor) error { return fn(sup, name) })
}

// withVMs is withVM for several VMs.
func (g *globals) withVMs(args []string, fn func(*supervisor.Supervisor, []string) error) error {
	names, err := vmNames(args)
	if err != nil {
		return err
	}
	return g.with(func(sup *supervisor.Supervisor) error { return fn(sup, names) })
}

// vmNames is vmName for each argument.
func vmNames(args []string) ([]string, error) {
	var names []string
	for _, a := range args {
		n, err := vmName(a)
		if err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, nil
}

// withFiles is with for a command on VM files, each parsed first.
func (g *globals) withFiles(paths []string, fn func(*supervisor.Supervisor, []*spec.File) error) error {
	return g.with(func(sup *supervisor.Supervisor) error {
		fs, err := loadFiles(sup, paths)
		if err != nil {
			return err
		}
		return fn(sup, fs)
	})
}

// isFileArg says whether a NAME|FILE argument is a file.
func isFileArg(arg string) bool {
	return strings.HasSuffix(arg, ".toml") || strings.ContainsRune(arg, '/')
}

// vmName accepts a VM name or a TOML file defining one.
func vmName(arg string) (string, error) {
	if isFileArg(arg) {
		f, err := spec.Load(arg)
		if err != nil {
			return "", err
		}
		return f.VM.Name, nil
	}
	if err := spec.ValidName(arg); err != nil {
		return "", vmerr.Wrap(arg, err)
	}
	// vmsup's own units are no VM's: refused here, before any host (local
	// or remote) is asked.
	return arg, vmstore.NotVM(arg)
}

// usageTemplate is cobra's, with the global flags listed only in the root
// command's help: each command's help is about that command.
const usageTemplate = `Usage:{{if .Runnable}}
  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}
  {{.CommandPath}} [command]{{end}}{{if gt (len .Aliases) 0}}

Aliases:
  {{.NameAndAliases}}{{end}}{{if .HasExample}}

Examples:
{{.Example}}{{end}}{{if .HasAvailableSubCommands}}{{$cmds := .Commands}}{{if eq (len .Groups) 0}}

Available Commands:{{range $cmds}}{{if (or .IsAvailableCommand (eq .Name "help"))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{else}}{{range $group := .Groups}}

{{.Title}}{{range $cmds}}{{if (and (eq .GroupID $group.ID) (or .IsAvailableCommand (eq .Name "help")))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{if not .AllChildCommandsHaveGroup}}

Additional Commands:{{range $cmds}}{{if (and (eq .GroupID "") (or .IsAvailableCommand (eq .Name "help")))}}
  {{rpad .Name .NamePadding }} {{.Short}}{{end}}{{end}}{{end}}{{end}}{{end}}{{if .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}{{if .HasAvailableInheritedFlags}}

Global flags (--root, --systemd-bus, --wait, -v, ...): see "vmsup --help".{{end}}{{if .HasHelpSubCommands}}

Additional help topics:{{range .Commands}}{{if .IsAdditionalHelpTopicCommand}}
  {{rpad .CommandPath .CommandPathPadding}} {{.Short}}{{end}}{{end}}{{end}}{{if .HasAvailableSubCommands}}

Use "{{.CommandPath}} [command] --help" for more information about a command.{{end}}
`
