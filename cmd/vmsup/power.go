package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// fileOrApplied is the spec for a restart: the FILE given, or the spec the
// VM NAME was last started with.
func fileOrApplied(sup remoteapi.Ops, arg string) (*spec.File, error) {
	if isFileArg(arg) {
		return spec.Load(arg)
	}
	if _, err := vmName(arg); err != nil {
		return nil, err
	}
	return sup.AppliedSpec(arg)
}

func restartCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "restart NAME|FILE...",
		Short: "Gracefully shut VMs down and bring them up again (with FILE's spec, or the one NAME last ran with)",
		Example: "  vmsup restart web\n" +
			"  vmsup restart web.toml   # applies the edited file",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.ops(func(sup remoteapi.Ops) error {
				return eachVM(g, cmd, args, "restart", func(a string) (actionJSON, string, error) {
					f, err := fileOrApplied(sup, a)
					if err != nil {
						return actionJSON{}, "", err
					}
					r, err := sup.RestartWith(cmd.Context(), f, supervisor.RestartOptions{Waiting: gatePrinter(cmd.ErrOrStderr(), f.VM.Name)})
					act := actionJSON{Name: f.VM.Name, File: fileOf(a), Action: string(r.Action), State: stateJSON(r.State), Note: r.Note}
					return act, fmt.Sprintf("%s: %s (accel %s)", r.VM, r.Action, r.Accel), err
				})
			})
		},
	}
}

func rebootCmd(g *globals) *cobra.Command {
	var mode string
	c := &cobra.Command{
		Use:     "reboot NAME|FILE...",
		Short:   "Ask guests to reboot (guest agent, else ACPI); QEMU keeps running",
		Example: "  vmsup reboot web\n  vmsup reboot --mode acpi web",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.ops(func(sup remoteapi.Ops) error {
				return eachVM(g, cmd, args, "reboot", func(a string) (actionJSON, string, error) {
					name, err := vmName(a)
					if err != nil {
						return actionJSON{}, "", err
					}
					r, err := sup.Reboot(cmd.Context(), name, supervisor.RebootMode(mode))
					act := actionJSON{Name: name, File: fileOf(a), Action: "rebooted", State: "running", Note: "by " + r.Via}
					return act, fmt.Sprintf("%s: rebooted (%s)", name, r.Via), err
				})
			})
		},
	}
	c.Flags().StringVar(&mode, "mode", "", "\"agent\" or \"acpi\" (default: the guest agent if it answers, else ACPI)")
	return c
}

func resetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "reset NAME|FILE...",
		Short:   "Hard-reset guests at once, like the reset button; QEMU keeps running",
		Example: "  vmsup reset web",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.ops(func(sup remoteapi.Ops) error {
				return eachVM(g, cmd, args, "reset", func(a string) (actionJSON, string, error) {
					name, err := vmName(a)
					if err != nil {
						return actionJSON{}, "", err
					}
					act := actionJSON{Name: name, File: fileOf(a), Action: "reset", State: "running"}
					return act, name + ": reset", sup.Reset(cmd.Context(), name)
				})
			})
		},
	}
}

func killCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "kill NAME|FILE...",
		Aliases: []string{"destroy"},
		Short:   "End VMs now with SIGKILL: no shutdown, no grace (down --force quits QEMU cleanly instead)",
		Example: "  vmsup kill web",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.ops(func(sup remoteapi.Ops) error {
				return eachVM(g, cmd, args, "kill", func(a string) (actionJSON, string, error) {
					name, err := vmName(a)
					if err != nil {
						return actionJSON{}, "", err
					}
					r, err := sup.Kill(cmd.Context(), name)
					return downAction(r, a), downLine(r), err
				})
			})
		},
	}
}

// eachVM runs fn for each argument, reporting its action; a failure does
// not stop the others, and the command fails if any did.
func eachVM(g *globals, cmd *cobra.Command, args []string, verb string, fn func(arg string) (actionJSON, string, error)) error {
	failed := 0
	var last error
	for i, a := range args {
		if i > 0 && errors.Is(last, supervisor.ErrInterrupted) {
			return fmt.Errorf("%s: %w after %d of %d VMs (the others were left alone)", verb, supervisor.ErrInterrupted, i, len(args))
		}
		act, line, err := fn(a)
		if err != nil {
			failed++
			last = err
			if act.Name == "" && !isFileArg(a) {
				act.Name = a
			}
			if isFileArg(a) && act.File == "" {
				act.File = a
			}
			act.Error = toErrorJSON(err)
			if len(args) > 1 && !g.json {
				printErr(cmd.ErrOrStderr(), err)
			}
			line = ""
		}
		g.out.action(act, line)
	}
	switch {
	case failed == 0:
		return nil
	case len(args) == 1:
		return last
	}
	return fmt.Errorf("%s: %d of %d VMs failed", verb, failed, len(args))
}

// downLine is the line down and kill print for a VM.
func downLine(r supervisor.DownResult) string {
	msg := map[supervisor.StopStep]string{
		supervisor.StoppedAlready: "already shut off",
		supervisor.StoppedACPI:    "guest powered off (ACPI)",
		supervisor.StoppedAgent:   "guest powered off (guest agent)",
		supervisor.StoppedQuit:    "QEMU quit",
		supervisor.StoppedKill:    "QEMU killed",
	}[r.Step]
	if r.Note != "" {
		msg += "; " + r.Note
	}
	return fmt.Sprintf("%s: %s (%s)", r.VM, msg, r.Duration.Round(time.Millisecond))
}

// downAction is down's and kill's report in JSON.
func downAction(r supervisor.DownResult, arg string) actionJSON {
	return actionJSON{Name: r.VM, File: fileOf(arg), Action: string(r.Step), State: stateJSON(supervisor.StateShutOff), Note: r.Note}
}

// fileOf is arg if it names a file, else "".
func fileOf(arg string) string {
	if isFileArg(arg) {
		return arg
	}
	return ""
}

// gatePrinter tells the user what a restart's health gate waits for: after
// a second, then every 5 s.
func gatePrinter(w io.Writer, name string) supervisor.GateWaiting {
	next := time.Second
	return func(waited, timeout time.Duration, what string) {
		if waited < next {
			return
		}
		next = (waited/(5*time.Second) + 1) * 5 * time.Second
		fmt.Fprintf(w, "%s: health gate: waiting for %s (%ds of %s)…\n", name, what, int(waited/time.Second), timeout)
	}
}

// waitingPrinter tells the user what down is waiting for: after a second,
// then every 5 s.
func waitingPrinter(w io.Writer, name string) func(waited, timeout time.Duration) {
	return func(waited, timeout time.Duration) {
		s := int(waited.Round(time.Second) / time.Second)
		if s == 1 || s%5 == 0 {
			fmt.Fprintf(w, "%s: waiting for the guest to power off (%ds of %s)…\n", name, s, timeout)
		}
	}
}
