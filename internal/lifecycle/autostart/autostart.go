// Package autostart brings VMs back after a host reboot without a resident
// daemon. The VMs' units are transient and end with the boot, so VMs that
// must come back are marked (ROOT/autostart/NAME.toml, a symlink to the
// VM's file, like "systemctl enable"), and one persistent unit, BootUnit,
// runs "vmsup autostart" at boot to bring them up, each once per boot (a
// mark under RunDir, which /run empties at every boot). The VMs' own units
// stop gracefully at shutdown: systemd stops them before shutdown.target and
// their stop hook powers the guest down.
package autostart

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// BootUnit is the persistent unit Enable installs. It cannot clash with a
// VM's unit (vmsup-NAME.service).
const BootUnit = "vmsup.service"

const bootUnitTimeout = 15 * time.Minute

// Host is what autostart needs of the supervisor.
type Host interface {
	State() vmstore.Store
	// Validate checks files as up does; CheckOwner refuses a file that is
	// not its VM's.
	Validate(ctx context.Context, files ...*spec.File) error
	CheckOwner(f *spec.File) error
	// Up brings f's VM up and says what it did ("started", "unchanged",
	// ...) and a note.
	Up(ctx context.Context, f *spec.File) (action, note string, err error)
	// AppliedFile is the spec the VM last started with (a VM that came by
	// migration is enabled from it).
	AppliedFile(name string) (*spec.File, error)
	// Reload makes systemd read its unit files again.
	Reload(ctx context.Context) error
}

// Options say where the boot unit goes and what it runs.
type Options struct {
	UnitDir    string   // where the boot unit is installed
	BootTarget string   // the target that pulls it in
	RunDir     string   // per-boot state: which VMs autostart already started
	Command    []string // the vmsup command line (with its options) the boot unit runs "autostart" with
	kvm        kvmHost  // where autostart waits for KVM (tests give a fake one)
}

// Marks are a state root's autostart marks and the boot unit.
type Marks struct {
	h Host
	o Options
}

// New returns the autostart of h with o.
func New(h Host, o Options) *Marks { return &Marks{h: h, o: o} }

// EnableResult reports one VM of an Enable call.
type EnableResult struct {
	VM   string `json:"vm"`
	File string `json:"file"`
	Note string `json:"note,omitempty"` // e.g. "was enabled from /old.toml"
}

// Result reports one enabled VM of an Autostart call.
type Result struct {
	VM     string `json:"vm"`
	File   string `json:"file"`
	Action string `json:"action,omitempty"` // empty when skipped or failed
	Note   string `json:"note,omitempty"`
}

// bootedMark records that autostart brought the VM up in this boot: under
// RunDir (emptied at every boot), so a VM the operator took down after boot
// stays down when the boot unit is started again.
func (m *Marks) bootedMark(name string) string {
	return filepath.Join(m.o.RunDir, "autostarted", name)
}

// Enable marks the VMs in files to start at every boot and installs the boot
// unit. The files are checked as up checks them first; an invalid one marks
// nothing. Enabling does not start a VM (up does).
func (m *Marks) Enable(ctx context.Context, files ...*spec.File) ([]EnableResult, error) {
	if err := m.h.Validate(ctx, files...); err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := m.h.CheckOwner(f); err != nil {
			return nil, err
		}
	}
	out, err := m.mark(files)
	if err != nil {
		return out, err
	}
	return out, m.SyncBootUnit(ctx)
}

// EnableDeclared is up's part for files that say autostart = true: the
// same as Enable, for VMs not enabled yet (a mark made by enable or a
// migration is left as it is).
func (m *Marks) EnableDeclared(ctx context.Context, files []*spec.File) error {
	var todo []*spec.File
	for _, f := range files {
		if f.VM.Autostart && !m.IsEnabled(f.VM.Name) {
			todo = append(todo, f)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if _, err := m.mark(todo); err != nil {
		return err
	}
	return m.SyncBootUnit(ctx)
}

// mark links each VM's mark to its file.
func (m *Marks) mark(files []*spec.File) ([]EnableResult, error) {
	var out []EnableResult
	for _, f := range files {
		file := f.Path
		if abs, err := filepath.Abs(file); err == nil {
			file = abs
		}
		r := EnableResult{VM: f.VM.Name, File: file}
		old, err := m.h.State().Mark(f.VM.Name, file)
		if err != nil {
			return out, vmerr.Wrap(f.VM.Name, fmt.Errorf("enable: %w", err))
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
func (m *Marks) Disable(ctx context.Context, names ...string) error {
	for _, n := range names {
		if err := spec.ValidName(n); err != nil {
			return vmerr.Wrap(n, err)
		}
		if err := m.h.State().Unmark(n); err != nil {
			return vmerr.Wrap(n, fmt.Errorf("disable: %w", err))
		}
	}
	return m.SyncBootUnit(ctx)
}

// Enabled lists the VMs marked for autostart, with the file each starts from.
func (m *Marks) Enabled() (map[string]string, error) { return m.h.State().Marked() }

// IsEnabled reports whether the VM is marked for autostart.
func (m *Marks) IsEnabled(name string) bool { return m.h.State().IsMarked(name) }

// SyncBootUnit installs the boot unit while any VM is enabled and removes
// it otherwise, then reloads systemd if its files changed.
func (m *Marks) SyncBootUnit(ctx context.Context) error {
	enabled, err := m.Enabled()
	if err != nil {
		return err
	}
	b := m.bootUnit()
	var changed bool
	if len(enabled) > 0 {
		changed, err = b.Install(m.o.UnitDir)
	} else {
		changed, err = b.Uninstall(m.o.UnitDir)
	}
	if err != nil {
		return fmt.Errorf("boot unit %s in %s: %w", b.Name, m.o.UnitDir, err)
	}
	if !changed {
		return nil
	}
	return m.h.Reload(ctx)
}

// BootUnitFile is the boot unit's file as SyncBootUnit installs it.
func (m *Marks) BootUnitFile() ([]byte, error) { return m.bootUnit().Render() }

// bootUnit runs vmsup with the options that matter for starting VMs; it
// runs inside the booted system, so it talks to that system's bus and
// journal (the defaults).
func (m *Marks) bootUnit() units.BootUnit {
	return units.BootUnit{
		Name:        BootUnit,
		Description: "vmsup: start the VMs enabled for boot (vmsup enable)",
		ExecStart:   append(append([]string(nil), m.o.Command...), "autostart"),
		Wants:       []string{"network-online.target"},
		// Whatever VMs' disks and NICs may need, if this host has it.
		// systemd-modules-load: a kvm module named in modules-load.d is
		// loaded (Autostart also waits for /dev/kvm, kvm.go).
		After: []string{"local-fs.target", "remote-fs.target", "dbus.service", "systemd-modules-load.service",
			"openvswitch-switch.service", "iscsid.service", "ceph.target"},
		Timeout:  bootUnitTimeout,
		WantedBy: m.o.BootTarget,
	}
}

// Autostart brings up every enabled VM once per boot, each on its own: one
// that fails (a missing file, a QEMU that refuses) does not keep the others
// down. The error names every VM that failed.
func (m *Marks) Autostart(ctx context.Context) ([]Result, error) {
	enabled, err := m.Enabled()
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(enabled))
	for n := range enabled {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Result
	var errs []error
	kvmNote := ""
	if len(names) > 0 {
		kvmNote = m.o.kvm.waitKVM(ctx)
	}
	for _, n := range names {
		r := Result{VM: n, File: enabled[n]}
		if _, err := os.Stat(m.bootedMark(n)); err == nil {
			r.Note = "already started once this boot; left as it is"
			out = append(out, r)
			continue
		}
		action, note, err := m.startOne(ctx, n, enabled[n])
		if err != nil {
			r.Note = err.Error()
			errs = append(errs, err)
			out = append(out, r)
			continue
		}
		r.Action, r.Note = action, note
		if kvmNote != "" {
			r.Note = strings.TrimPrefix(r.Note+"; "+kvmNote, "; ")
		}
		if err := os.MkdirAll(filepath.Dir(m.bootedMark(n)), 0o755); err == nil {
			_ = os.WriteFile(m.bootedMark(n), nil, 0o644)
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

func (m *Marks) startOne(ctx context.Context, name, file string) (action, note string, err error) {
	f, err := m.loadEnabled(name, file)
	if err != nil {
		return "", "", vmerr.Wrap(name, fmt.Errorf("autostart: %w", err))
	}
	if f.VM.Name != name {
		return "", "", vmerr.Wrap(name, fmt.Errorf("autostart: %s now defines VM %q; run vmsup enable again", file, f.VM.Name))
	}
	return m.h.Up(ctx, f)
}

// loadEnabled reads the file a mark points to. A VM that came here by
// migration is enabled from its applied spec, whose relative paths resolve
// against the file it was first started from.
func (m *Marks) loadEnabled(name, file string) (*spec.File, error) {
	if file != m.h.State().Paths(name).Spec {
		return spec.Load(file)
	}
	return m.h.AppliedFile(name)
}
