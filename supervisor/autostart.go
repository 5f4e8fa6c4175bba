package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Autostart: the VMs' units are transient and end with the boot, so VMs that
// must come back after a reboot are marked (Root/autostart/NAME.toml, a
// symlink to the VM's file, like "systemctl enable"), and one persistent unit,
// BootUnitName, runs "vmsup autostart" at boot to bring them up. The VMs'
// own units stop gracefully at shutdown: systemd stops them before
// shutdown.target and their stop hook powers the guest down over ACPI.

// BootUnitName is the persistent unit vmsup enable installs. It cannot clash
// with a VM's unit (vmsup-NAME.service).
const BootUnitName = "vmsup.service"

const bootUnitTimeout = 15 * time.Minute

// bootedMark records that autostart brought the VM up in this boot: it lives
// under RunDir (/run, emptied at every boot), so a VM the operator took down
// after boot stays down when the boot unit is started again.
func (s *Supervisor) bootedMark(name string) string {
	return filepath.Join(s.opts.RunDir, "autostarted", name)
}

// EnableResult reports one VM of an Enable call.
type EnableResult struct {
	VM   string `json:"vm"`
	File string `json:"file"`
	Note string `json:"note,omitempty"` // e.g. "was enabled from /old.toml"
}

// Enable marks the VMs in files to start at every boot and installs the boot
// unit. The files are checked as Up checks them first; an invalid one marks
// nothing. Enabling does not start a VM (Up does).
func (s *Supervisor) Enable(ctx context.Context, files ...*spec.File) ([]EnableResult, error) {
	if err := s.ValidateContext(ctx, files...); err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := s.checkOwner(f, false); err != nil {
			return nil, err
		}
	}
	out, err := s.mark(files)
	if err != nil {
		return out, err
	}
	return out, s.syncBootUnit(ctx)
}

// enableDeclared is Up's part for files that say autostart = true: the same
// as Enable, for VMs not enabled yet (a mark made by enable or a migration
// is left as it is).
func (s *Supervisor) enableDeclared(ctx context.Context, files []*spec.File) error {
	var todo []*spec.File
	for _, f := range files {
		if f.VM.Autostart && !s.isEnabled(f.VM.Name) {
			todo = append(todo, f)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if _, err := s.mark(todo); err != nil {
		return err
	}
	return s.syncBootUnit(ctx)
}

// mark links each VM's mark to its file.
func (s *Supervisor) mark(files []*spec.File) ([]EnableResult, error) {
	var out []EnableResult
	for _, f := range files {
		file := absPath(f.Path)
		r := EnableResult{VM: f.VM.Name, File: file}
		old, err := s.state.Mark(f.VM.Name, file)
		if err != nil {
			return out, vmErr(f.VM.Name, fmt.Errorf("enable: %w", err))
		}
		if old != "" && old != file {
			r.Note = "was enabled from " + old
		}
		out = append(out, r)
	}
	return out, nil
}

// Disable removes the boot marks of the named VMs; it does not stop them.
// A VM that was not enabled is not an error. When no VM is left enabled the
// boot unit is removed too.
func (s *Supervisor) Disable(ctx context.Context, names ...string) error {
	for _, n := range names {
		if err := spec.ValidName(n); err != nil {
			return vmErr(n, err)
		}
		if err := s.state.Unmark(n); err != nil {
			return vmErr(n, fmt.Errorf("disable: %w", err))
		}
	}
	return s.syncBootUnit(ctx)
}

// Enabled lists the VMs marked for autostart, with the file each starts from.
func (s *Supervisor) Enabled() (map[string]string, error) {
	return s.state.Marked()
}

// syncBootUnit installs the boot unit while any VM is enabled and removes it
// otherwise, then reloads systemd if its files changed.
func (s *Supervisor) syncBootUnit(ctx context.Context) error {
	enabled, err := s.Enabled()
	if err != nil {
		return err
	}
	b := s.bootUnit()
	var changed bool
	if len(enabled) > 0 {
		changed, err = b.Install(s.opts.UnitDir)
	} else {
		changed, err = b.Uninstall(s.opts.UnitDir)
	}
	if err != nil {
		return fmt.Errorf("boot unit %s in %s: %w", b.Name, s.opts.UnitDir, err)
	}
	if !changed {
		return nil
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return err
	}
	return sd.Reload(ctx)
}

// bootUnit runs this vmsup with the options that matter for starting VMs;
// it runs inside the booted system, so it talks to that system's bus and
// journal (the defaults).
func (s *Supervisor) bootUnit() units.BootUnit {
	argv := []string{s.opts.Self, "--root", s.opts.Root, "--qemu", s.opts.QEMU, "--qemu-user", s.opts.QEMUUser}
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
	return units.BootUnit{
		Name:        BootUnitName,
		Description: "vmsup: start the VMs enabled for boot (vmsup enable)",
		ExecStart:   append(argv, "autostart"),
		Wants:       []string{"network-online.target"},
		// Whatever VMs' disks and NICs may need, if this host has it.
		After:    []string{"local-fs.target", "remote-fs.target", "dbus.service", "openvswitch-switch.service", "iscsid.service", "ceph.target"},
		Timeout:  bootUnitTimeout,
		WantedBy: s.opts.BootTarget,
	}
}

// AutostartResult reports one enabled VM of an Autostart call.
type AutostartResult struct {
	VM     string   `json:"vm"`
	File   string   `json:"file"`
	Action UpAction `json:"action,omitempty"` // empty when skipped or failed
	Note   string   `json:"note,omitempty"`
}

// Autostart brings up every enabled VM once per boot, each on its own: one
// that fails (a missing file, a QEMU that refuses) does not keep the others
// down. The error names every VM that failed.
func (s *Supervisor) Autostart(ctx context.Context) ([]AutostartResult, error) {
	enabled, err := s.Enabled()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(enabled))
	for n := range enabled {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []AutostartResult
	var errs []error
	for _, n := range names {
		r := AutostartResult{VM: n, File: enabled[n]}
		if _, err := os.Stat(s.bootedMark(n)); err == nil {
			r.Note = "already started once this boot; left as it is"
			out = append(out, r)
			continue
		}
		up, err := s.autostartOne(ctx, n, enabled[n])
		if err != nil {
			r.Note = err.Error()
			errs = append(errs, err)
			out = append(out, r)
			continue
		}
		r.Action, r.Note = up.Action, up.Note
		if err := os.MkdirAll(filepath.Dir(s.bootedMark(n)), 0o755); err == nil {
			_ = os.WriteFile(s.bootedMark(n), nil, 0o644)
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

func (s *Supervisor) autostartOne(ctx context.Context, name, file string) (UpResult, error) {
	f, err := s.loadEnabled(name, file)
	if err != nil {
		return UpResult{}, vmErr(name, fmt.Errorf("autostart: %w", err))
	}
	if f.VM.Name != name {
		return UpResult{}, vmErr(name, fmt.Errorf("autostart: %s now defines VM %q; run vmsup enable again", file, f.VM.Name))
	}
	res, err := s.Up(ctx, f)
	if err != nil {
		return UpResult{}, err
	}
	return res[0], nil
}

// loadEnabled reads the file a mark points to. A VM that came here by
// migration is enabled from its applied spec, whose relative paths resolve
// against the file it was first started from.
func (s *Supervisor) loadEnabled(name, file string) (*spec.File, error) {
	if file != s.paths(name).Spec {
		return spec.Load(file)
	}
	return s.appliedFile(name)
}

// isEnabled reports whether the VM is marked for autostart.
func (s *Supervisor) isEnabled(name string) bool { return s.state.IsMarked(name) }
