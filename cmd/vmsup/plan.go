package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// changeJSON is one plan line in --json (every key always present).
type changeJSON struct {
	Field string `json:"field"`
	From  string `json:"from"`
	To    string `json:"to"`
	Class string `json:"class"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
	Op    string `json:"op"`
	Why   string `json:"why"`
	Guest string `json:"guest"`
	Warn  string `json:"warn"`
}

func changesJSON(cs []plan.Change) []changeJSON {
	out := []changeJSON{}
	for _, c := range cs {
		out = append(out, changeJSON{Field: c.Field, From: c.From, To: c.To, Class: string(c.Class), Kind: string(c.Kind),
			Name: c.Name, Op: c.Op, Why: c.Why, Guest: c.Guest, Warn: c.Warn})
	}
	return out
}

func planCmd(g *globals) *cobra.Command {
	var o supervisor.PlanOptions
	c := &cobra.Command{
		Use:   "plan FILE...",
		Short: "Say what apply would change in each running VM, and how: live, at the next reboot, by a restart, or not at all",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsFiles(args, func(sup remoteapi.Ops, fs []*spec.File) error {
				var plans []supervisor.PlanResult
				var errs []error
				for _, f := range fs {
					p, err := sup.PlanWith(cmd.Context(), f, o)
					if err != nil {
						errs = append(errs, err)
						continue
					}
					plans = append(plans, p)
				}
				if err := errors.Join(errs...); err != nil && len(plans) == 0 {
					return err
				}
				werr := g.out.object(nonNil(plans), func(w io.Writer) { printPlans(w, plans) })
				return errors.Join(append(errs, werr)...)
			})
		},
	}
	c.Flags().BoolVar(&o.Adopt, "adopt", false, "plan FILE for its VM although the VM was started from another file (what apply --adopt would do)")
	return c
}

func printPlans(w io.Writer, ps []supervisor.PlanResult) {
	for _, p := range ps {
		switch {
		case !p.Running:
			fmt.Fprintf(w, "%s: %s\n", p.VM, p.Note)
		case p.InSync:
			fmt.Fprintf(w, "%s: in sync with %s\n", p.VM, p.File)
		default:
			fmt.Fprintf(w, "%s: %d change(s) from %s:\n", p.VM, len(p.Changes), p.File)
		}
		for _, c := range p.Changes {
			fmt.Fprintf(w, "  %s\n", c)
		}
		for _, k := range p.Kept {
			fmt.Fprintf(w, "  kept       %s (attached by hand; vmsup disk/nic detach removes it)\n", k)
		}
		if p.Pending != nil && !p.InSync {
			when := "a restart (vmsup apply --restart)"
			if p.Pending.AtReboot {
				when = "the guest's next reboot"
			}
			fmt.Fprintf(w, "  pending since an earlier apply, for %s\n", when)
		}
	}
}

type applyResultJSON struct {
	Name    string       `json:"name"`
	File    string       `json:"file"`
	Action  string       `json:"action"`
	Applied []changeJSON `json:"applied"`
	Pending []changeJSON `json:"pending"`
	Note    string       `json:"note"`
	Error   *errorJSON   `json:"error"`
}

func applyCmd(g *globals) *cobra.Command {
	var o supervisor.ApplyOptions
	c := &cobra.Command{
		Use:   "apply FILE...",
		Short: "Make each running VM match its file: live where QEMU can, the rest at the next reboot or by a restart",
		Long: `Apply makes each running VM match its edited file. The live changes
(disks and NICs in and out, vCPUs and memory up, I/O limits, link state, the
CD-ROM's medium, unit limits, description, autostart) are made at once, each
on its own. Changes that need a new QEMU are applied when the guest next
reboots (always so for boot settings; --at-next-reboot for the rest), or now
by a restart gated by the VM's [health] (--restart): if the new spec does not
pass, the previous one comes back. Without either flag they are recorded as
pending. A change that cannot be applied at all refuses the whole file. A
second apply of the same file does nothing.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.opsFiles(args, func(sup remoteapi.Ops, fs []*spec.File) error {
				var results []applyResultJSON
				var errs []error
				for _, f := range fs {
					o.Waiting = gatePrinter(cmd.ErrOrStderr(), f.VM.Name)
					r, err := sup.Apply(cmd.Context(), f, o)
					rj := applyResultJSON{Name: f.VM.Name, File: f.Path, Action: applyAction(r, err), Applied: changesJSON(r.Applied),
						Pending: changesJSON(r.Pending), Note: r.Note, Error: toErrorJSON(err)}
					results = append(results, rj)
					if err != nil {
						errs = append(errs, err)
					}
				}
				err := errors.Join(errs...)
				doc := struct {
					Results []applyResultJSON `json:"results"`
					Error   *errorJSON        `json:"error"`
				}{results, toErrorJSON(err)}
				werr := g.out.object(doc, func(w io.Writer) { printApplies(w, results) })
				return errors.Join(err, werr)
			})
		},
	}
	c.Flags().BoolVar(&o.Restart, "restart", false, "restart now for the changes that need it (health-gated; the previous spec comes back on failure)")
	c.Flags().BoolVar(&o.AtNextReboot, "at-next-reboot", false, "apply the changes that need a restart when the guest next reboots")
	c.Flags().BoolVar(&o.Adopt, "adopt", false, "make FILE the file of its VM where the VM was started from another file (otherwise refused)")
	return c
}

func applyAction(r supervisor.ApplyResult, err error) string {
	switch {
	case err != nil:
		return "failed"
	case r.Restarted:
		return "restarted"
	case r.AtReboot:
		return "pending-reboot"
	case len(r.Pending) > 0:
		return "pending"
	case len(r.Applied) > 0:
		return "applied"
	}
	return "unchanged"
}

func printApplies(w io.Writer, rs []applyResultJSON) {
	for _, r := range rs {
		if r.Error != nil {
			continue // said on stderr
		}
		fmt.Fprintf(w, "%s: %s", r.Name, r.Action)
		if len(r.Applied) > 0 {
			fmt.Fprintf(w, " (%d live)", len(r.Applied))
		}
		if r.Note != "" {
			fmt.Fprintf(w, "; %s", r.Note)
		}
		fmt.Fprintln(w)
		for _, c := range r.Applied {
			fmt.Fprintf(w, "  applied  %s\n", c.Field)
		}
		for _, c := range r.Pending {
			fmt.Fprintf(w, "  pending  %s (%s)\n", c.Field, c.Class)
		}
	}
}
