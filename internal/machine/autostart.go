package machine

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/autostart"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Autostart (internal/lifecycle/autostart): VMs marked to come back after a host
// reboot, and the one persistent unit that brings them up. Here are its
// Host and the library's API.

// BootUnitName is the persistent unit vmsup enable installs.
const BootUnitName = autostart.BootUnit

// EnableResult reports one VM of an Enable call.
type EnableResult = autostart.EnableResult

// AutostartResult reports one enabled VM of an Autostart call.
type AutostartResult struct {
	VM     string   `json:"vm"`
	File   string   `json:"file"`
	Action UpAction `json:"action,omitempty"` // empty when skipped or failed
	Note   string   `json:"note,omitempty"`
}

// Enable marks the VMs in files to start at every boot and installs the
// boot unit (checked as up checks them first; nothing is started).
func (s *Env) Enable(ctx context.Context, files ...*spec.File) ([]EnableResult, error) {
	return s.AutostartMarks().Enable(ctx, files...)
}

// Disable removes the boot marks of the named VMs (it does not stop them).
func (s *Env) Disable(ctx context.Context, names ...string) error {
	return s.AutostartMarks().Disable(ctx, names...)
}

// Enabled lists the VMs marked for autostart, with the file each starts from.
func (s *Env) Enabled() (map[string]string, error) { return s.AutostartMarks().Enabled() }

// Autostart brings up every enabled VM once per boot, each on its own.
func (s *Env) Autostart(ctx context.Context) ([]AutostartResult, error) {
	res, err := s.AutostartMarks().Autostart(ctx)
	out := make([]AutostartResult, len(res))
	for i, r := range res {
		out[i] = AutostartResult{VM: r.VM, File: r.File, Action: UpAction(r.Action), Note: r.Note}
	}
	return out, err
}

func (s *Env) enableDeclared(ctx context.Context, files []*spec.File) error {
	return s.AutostartMarks().EnableDeclared(ctx, files)
}

// AutostartMarks runs this vmsup, with the options that matter for starting VMs,
// from the boot unit.
func (s *Env) AutostartMarks() *autostart.Marks {
	argv := append([]string{s.opts.Self, "--root", s.opts.Root}, s.startFlags()...)
	return autostart.New(autostartHost{s}, autostart.Options{UnitDir: s.opts.UnitDir, BootTarget: s.opts.BootTarget,
		RunDir: s.opts.RunDir, Command: argv})
}

// autostartHost is autostart's Host.
type autostartHost struct{ s *Env }

var _ autostart.Host = autostartHost{}

func (h autostartHost) State() vmstore.Store { return h.s.state }
func (h autostartHost) Validate(ctx context.Context, files ...*spec.File) error {
	return h.s.ValidateContext(ctx, files...)
}
func (h autostartHost) CheckOwner(f *spec.File) error { return h.s.CheckOwner(f, false) }
func (h autostartHost) Up(ctx context.Context, f *spec.File) (string, string, error) {
	res, err := h.s.Up(ctx, f)
	if err != nil {
		return "", "", err
	}
	return string(res[0].Action), res[0].Note, nil
}
func (h autostartHost) AppliedFile(name string) (*spec.File, error) { return h.s.AppliedFile(name) }
func (h autostartHost) Reload(ctx context.Context) error {
	sd, err := h.s.Systemd(ctx)
	if err != nil {
		return err
	}
	return sd.Reload(ctx)
}

// startFlags are the options that shape a start, as the flags that give
// them (which RunHook reads too): what a unit that runs vmsup to start or
// settle a VM (the boot unit, a guardian, the stop-post hook that may start
// one) passes on, so the VM starts under the same host policy (QEMU, its
// user, the places VM files may name) as the command that set it up.
func (s *Env) startFlags() []string {
	argv := []string{"--qemu", s.opts.QEMU, "--qemu-user", s.opts.QEMUUser}
	for _, places := range []struct {
		flag string
		dirs []string
	}{{"--image-dir", s.opts.ImageDirs}, {"--block-dir", s.opts.BlockDirs}, {"--config-dir", s.opts.ConfigDirs}, {"--allow-path", s.opts.AllowPaths}} {
		for _, d := range places.dirs {
			argv = append(argv, places.flag, d)
		}
	}
	if s.opts.Network.OVSDB != "" {
		argv = append(argv, "--ovsdb", s.opts.Network.OVSDB)
	}
	return argv
}
