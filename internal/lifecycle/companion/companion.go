// Package companion runs the companion units that serve one QEMU of a VM
// from outside it: the console logger (internal/console/consolelog), swtpm
// (internal/lifecycle/vtpm) and one virtiofsd per virtiofs share
// (internal/lifecycle/virtiofs). swtpm and virtiofsd start just before their QEMU's
// unit, in a step of the VM's start; the console logger's socket starts
// with that unit, and the logger runs only while the guest prints
// (logger.go). Each runs as QEMU's user in a sandbox of its own, and ends
// with that QEMU (or is stopped when the VM is torn down). This package names
// the units, gives them their user, starts them, waits for them to listen
// and stops them; what each runs is its own package's.
package companion

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// The companions' steps of a start, after its record step.
const (
	StepConsole  = "console-log" // the console logger
	StepTPM      = "tpm"         // swtpm
	StepVirtioFS = "virtiofs"    // the shares' virtiofsd
)

// Companions start and stop the companions of the VMs of one state root.
type Companions struct {
	Self string // the vmsup binary the console logger runs
	// Systemd is the connection that runs the VMs' units.
	Systemd func(ctx context.Context) (*units.Manager, error)
	// Confinement is the VM's confinement record, for its QEMU's user.
	Confinement func(vm string) (*confine.Record, error)
	// LastWords is the last error line a unit wrote to the journal.
	LastWords func(ctx context.Context, unit string) string
}

var _ startplan.Contributor = Companions{}

// Steps readies the QEMU's console log (its FIFO socket starts with QEMU's
// unit), and starts its swtpm and virtiofsds if the VM has a TPM and
// shares; each of these steps' undo stops what it started. QEMU's argv
// names the console's FIFO and swtpm's socket of its own unit.
func (c Companions) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	plan.AddArgv(func(o *qemuargs.Options) {
		o.ConsoleLog = FIFO(plan.Paths, plan.Unit)
		o.TPMSocket = TPMPaths(plan.Paths, plan.Unit).Socket // each unit its own swtpm
	})
	// The logger's socket starts with QEMU's unit and ends with it: no undo.
	list := []steps.Step{{Name: StepConsole,
		Do: func(ctx context.Context) error { return c.prepareConsoleLog(ctx, f, plan) }}}
	if f.VM.TPM != nil {
		list = append(list, steps.Step{Name: StepTPM,
			Do:   func(ctx context.Context) error { return c.startTPM(ctx, f, plan) },
			Undo: func(ctx context.Context) { c.stop(ctx, unitName("tpm", plan.Unit)) }})
	}
	if f.VM.HasVirtioFS() {
		list = append(list, steps.Step{Name: StepVirtioFS,
			Do:   func(ctx context.Context) error { return c.startVirtioFS(ctx, f, plan) },
			Undo: func(ctx context.Context) { c.stopVirtioFS(ctx, f, plan) }})
	}
	return list
}

// unitName is the unit of kind that serves the VM unit vmUnit:
// "vmsup-KIND@NAME" ("@" keeps it out of the VM list; no VM unit has one)
// and, for the alternate unit of a local migration,
// "vmsup-KIND@NAME:migrated".
func unitName(kind, vmUnit string) string {
	base := strings.TrimSuffix(strings.TrimPrefix(vmUnit, "vmsup-"), ".service")
	return "vmsup-" + kind + "@" + strings.Replace(base, "@", ":", 1) + ".service"
}

// alt is the alternate name of the VM unit vmUnit ("" for the usual one):
// each QEMU of a local migration has its own companions' files.
func alt(vmUnit string) (string, bool) {
	_, a, ok := strings.Cut(strings.TrimSuffix(vmUnit, ".service"), "@")
	return a, ok
}

// stop stops a companion unit of a start, if it runs.
func (c Companions) stop(ctx context.Context, unit string) {
	if sd, err := c.Systemd(context.WithoutCancel(ctx)); err == nil {
		Stop(ctx, sd, unit)
	}
}

// Stop stops a companion unit, if it runs.
func Stop(ctx context.Context, sd *units.Manager, unit string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), steps.UndoTimeout)
	defer cancel()
	_ = sd.Stop(uctx, unit)
	_ = sd.ResetFailed(uctx, unit)
}

// StopLeft stops what may still serve VM name (its state paths p) once no
// QEMU of it runs: the console sockets of both its units, once their
// FIFOs are empty; swtpm and virtiofsd end with their QEMU, this is for
// one whose QEMU never came (its start killed in between).
func (c Companions) StopLeft(ctx context.Context, p vmstore.Paths, name string) {
	main := vmstore.UnitName(name)
	for _, u := range []string{main, vmstore.AltUnit(name, main)} {
		_ = c.StopConsoleLog(ctx, p, u)
	}
	// A companion's directory is made before its unit starts: a VM with
	// none (most) costs a down no D-Bus call.
	ents, _ := os.ReadDir(p.Dir)
	if !slices.ContainsFunc(ents, func(e os.DirEntry) bool {
		return strings.HasPrefix(e.Name(), "tpm") || strings.HasPrefix(e.Name(), "virtiofs-")
	}) {
		return
	}
	sd, err := c.Systemd(ctx)
	if err != nil {
		return
	}
	left, err := sd.List(ctx, unitName("tpm", main), unitName("tpm", vmstore.AltUnit(name, main)),
		"vmsup-fs-*@"+name+".service")
	if err != nil {
		return
	}
	for _, st := range left {
		Stop(ctx, sd, st.Name)
	}
}

// user is who a companion of VM vm runs as, and its sandbox: QEMU's
// confined user (the sandbox's paths are the companion's to set), else the
// owner of the state directory, unsandboxed.
func (c Companions) user(vm string, p vmstore.Paths) (sb *units.Sandbox, uid, gid int, err error) {
	if r, err := c.Confinement(vm); err == nil && r.User != "" && r.UID != 0 {
		return &units.Sandbox{User: r.User, Group: r.User}, int(r.UID), int(r.GID), nil
	}
	fi, err := os.Stat(p.Dir)
	if err != nil {
		return nil, 0, 0, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return nil, int(st.Uid), int(st.Gid), nil
}

// readyTimeout bounds how long a companion takes to listen (swtpm: ~20 ms
// measured).
const readyTimeout = 10 * time.Second

// waitSocket waits until the companion unit listens on sock, or fails
// with its last words when it ends first.
func (c Companions) waitSocket(ctx context.Context, sd *units.Manager, unit, sock string) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		if st, err := sd.Status(ctx, unit); err == nil && st.Gone() || time.Now().After(deadline) {
			return fmt.Errorf("did not listen on %s: %s", sock, c.LastWords(ctx, unit))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
