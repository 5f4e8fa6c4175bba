package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// loadFiles parses every file and reports the errors of all of them, in
// file order, before anything is started. A VM's name stands for the file
// it belongs to (loadFile).
func loadFiles(sup *supervisor.Supervisor, args []string) ([]*spec.File, error) {
	var fs []*spec.File
	var errs []error
	for _, a := range args {
		f, err := loadFile(sup, a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fs = append(fs, f)
	}
	return fs, errors.Join(errs...)
}

// loadFile parses the file arg names (fileArg).
func loadFile(sup *supervisor.Supervisor, arg string) (*spec.File, error) {
	path, err := fileArg(sup, arg)
	if err != nil {
		return nil, err
	}
	return spec.Load(path)
}

// loadFilePartial is loadFile giving the file as far as it could be read
// with its errors (spec.LoadPartial), for validate.
func loadFilePartial(sup *supervisor.Supervisor, arg string) (*spec.File, error) {
	path, err := fileArg(sup, arg)
	if err != nil {
		return nil, err
	}
	return spec.LoadPartial(path)
}

// fileArg is the path of the file arg names: a path, or the name of a VM
// vmsup knows, for the file that VM belongs to (its clone file, an
// exported or adopted one).
func fileArg(sup *supervisor.Supervisor, arg string) (string, error) {
	if sup == nil || isFileArg(arg) || spec.ValidName(arg) != nil {
		return arg, nil
	}
	if _, err := os.Stat(arg); err == nil {
		return arg, nil // a file in the working directory named like a VM
	}
	path, err := sup.FileOf(arg)
	if err != nil {
		return "", fmt.Errorf("%s: no such file, and %w", arg, err)
	}
	return path, nil
}

func upCmd(g *globals) *cobra.Command {
	var restart, adopt bool
	var from string
	c := &cobra.Command{
		Use:   "up FILE... | up --from-snapshot VM:TAG NEWNAME",
		Short: "Bring the VMs in FILEs up (idempotent: running VMs with the same spec are left alone), or start a clone of a VM's memory snapshot",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from != "" && g.rem.url != "" {
				return usageError{errors.New("up --from-snapshot: not available with --remote")}
			}
			if from != "" {
				return upClone(g, cmd, from, args)
			}
			return g.opsFiles(args, func(sup remoteapi.Ops, fs []*spec.File) error {
				return printUp(g, cmd, sup, fs, restart, adopt)
			})
		},
	}
	c.Flags().StringVar(&from, "from-snapshot", "", "start NEWNAME from VM:TAG, a memory snapshot of a booted VM (copy-on-write disks; the guest resumes instead of booting)")
	c.Flags().BoolVar(&adopt, "adopt", false, "make each FILE the file of its VM where the VM was started from another file (otherwise refused)")
	c.Flags().BoolVar(&restart, "restart-changed", false, "restart running VMs whose file changed (graceful down, then up; the previous spec comes back if the new one fails)")
	return c
}

// printUp runs Up and prints a line per VM; with restart, running VMs whose
// spec changed are restarted with it.
func printUp(g *globals, cmd *cobra.Command, sup remoteapi.Ops, fs []*spec.File, restart, adopt bool) error {
	res, err := sup.UpWith(cmd.Context(), supervisor.UpOptions{Adopt: adopt}, fs...)
	for _, r := range res {
		if r.Action == supervisor.Changed && restart && r.State == supervisor.StateRunning {
			i := slices.IndexFunc(fs, func(f *spec.File) bool { return f.VM.Name == r.VM })
			var rerr error
			o := supervisor.RestartOptions{Waiting: gatePrinter(cmd.ErrOrStderr(), r.VM)}
			if r, rerr = sup.RestartWith(cmd.Context(), fs[i], o); rerr != nil {
				return rerr
			}
		}
		line := fmt.Sprintf("%s: %s (accel %s)", r.VM, r.Action, r.Accel)
		if r.Action == supervisor.Changed {
			line += "; spec differs from the running VM, not restarted (up --restart-changed, or down then up, to apply)"
			if r.State != supervisor.StateRunning && restart {
				line += "; not restarted while it is " + string(r.State)
			}
		}
		if r.Note != "" {
			line += "; " + r.Note
		}
		file := ""
		if i := slices.IndexFunc(fs, func(f *spec.File) bool { return f.VM.Name == r.VM }); i >= 0 {
			file = fs[i].Path
		}
		g.out.action(actionJSON{Name: r.VM, File: file, Action: string(r.Action), State: stateJSON(r.State), Note: r.Note}, line)
	}
	return err
}

// upClone is up --from-snapshot VM:TAG NEWNAME.
func upClone(g *globals, cmd *cobra.Command, from string, args []string) error {
	src, tag, ok := strings.Cut(from, ":")
	if !ok || src == "" || tag == "" || len(args) != 1 {
		return usageError{errors.New("up --from-snapshot VM:TAG takes one argument, the new VM's name")}
	}
	return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
		r, err := sup.UpFromSnapshot(cmd.Context(), src, tag, name)
		if err != nil {
			return err
		}
		note := fmt.Sprintf("cloned from %s (resumed, not booted); disks: %s; its file: %s", r.From, strings.Join(r.Disks, ", "), r.File)
		if len(r.Dropped) > 0 {
			note += "; not carried over: " + strings.Join(r.Dropped, "; ")
		}
		g.out.action(actionJSON{Name: name, File: r.File, Action: string(r.Action), State: stateJSON(r.State), Note: note},
			fmt.Sprintf("%s: %s (accel %s); %s", name, r.Action, r.Accel, note))
		return nil
	})
}
