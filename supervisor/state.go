package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/renameio/v2"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// vmPaths are the files of one VM: what QEMU uses under Root/vms/NAME
// (Dir, which the QEMU user owns while the VM runs), and vmsup's own records
// under Root/records/NAME (root only). Everything vmsup decides from as root
// (the unit to stop, what to tear down) is read from Records, never from a
// file QEMU could rewrite.
type vmPaths struct {
	Dir, QMP, Events, Console, ConsoleLog, Agent, QMPLock, UEFIVars string
	Records, Spec, State                                            string
}

func (s *Supervisor) paths(name string) vmPaths {
	d := filepath.Join(s.opts.Root, "vms", name)
	r := filepath.Join(s.opts.Root, "records", name)
	return vmPaths{
		Dir:        d,
		Records:    r,
		Spec:       filepath.Join(r, "spec.toml"),
		State:      filepath.Join(r, "state.json"),
		QMP:        filepath.Join(d, "qmp.sock"),
		Events:     filepath.Join(d, "events.sock"),
		Console:    filepath.Join(d, "console.sock"),
		ConsoleLog: filepath.Join(d, "console.log"),
		Agent:      filepath.Join(d, "qga.sock"),
		QMPLock:    filepath.Join(d, "qmp.lock"),
		UEFIVars:   filepath.Join(d, "OVMF_VARS.fd"),
	}
}

// removeSockets removes the sockets a dead QEMU may have left behind (QEMU
// killed by a signal cannot unlink them).
func (p vmPaths) removeSockets() error {
	for _, sock := range []string{p.QMP, p.Events, p.Console, p.Agent} {
		if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// applied is what vmsup recorded when it last started a VM: enough to tell a
// changed spec from an unchanged one and to say how the VM was started.
type applied struct {
	Name        string          `json:"name"`
	SourceFile  string          `json:"source_file"`
	Spec        json.RawMessage `json:"spec"` // canonical form of the parsed spec
	Accel       spec.Accel      `json:"accel"`
	AccelReason string          `json:"accel_reason,omitempty"`
	// CPUModel and CPUMasks are the -cpu model the host probe chose when
	// the spec names none, and the features turned off for this host's KVM.
	CPUModel  string    `json:"cpu_model,omitempty"`
	CPUMasks  []string  `json:"cpu_masks,omitempty"`
	Argv      []string  `json:"argv"`
	StartedAt time.Time `json:"started_at"`
	// AttachedNICs were hot-plugged into the running VM (vmsup nic attach),
	// in order; Spec stays what the VM booted with.
	AttachedNICs []spec.NIC `json:"attached_nics,omitempty"`
	// Attached are the disks hot-plugged with `vmsup disk attach` (and kept
	// over restarts); HotplugPorts the root ports left empty at boot.
	Attached     []AttachedDisk `json:"attached_disks,omitempty"`
	HotplugPorts []string       `json:"hotplug_ports,omitempty"`
	// Unit is the systemd unit running the VM when it is not the usual
	// vmsup-NAME.service: after a migration on one host the new QEMU runs
	// under the other of the two names (see migrate.go). "" means the usual.
	Unit string `json:"unit,omitempty"`
	// MigratedFrom says where the running QEMU came from ("local" or a
	// host), empty for a VM started by up.
	MigratedFrom string `json:"migrated_from,omitempty"`
	// Resized: vCPUs and memory changed live (vmsup set), for this run.
	Resized *resized `json:"resized,omitempty"`
}

// unitOf returns the unit that runs (or last ran) the VM: the name recorded
// by a migration, else vmsup-NAME.service. Only the VM's two names are
// accepted, whatever the record says.
func (s *Supervisor) unitOf(name string) string {
	usual := units.Name(name)
	if a, err := s.readApplied(name); err == nil && a.Unit == altUnit(name, usual) {
		return a.Unit
	}
	return usual
}

func canonical(vm *spec.VM) json.RawMessage {
	b, err := json.Marshal(vm)
	if err != nil { // spec.VM holds only plain values
		panic(err)
	}
	return b
}

func (s *Supervisor) readApplied(name string) (*applied, error) {
	b, err := os.ReadFile(s.paths(name).State)
	if err != nil {
		return nil, err
	}
	var a applied
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("vm %q: %s: %w", name, s.paths(name).State, err)
	}
	return &a, nil
}

// writeApplied stores the spec copy and the record atomically (each file is
// replaced by rename, so a crash leaves the old or the new, never half).
func (s *Supervisor) writeApplied(a *applied, raw []byte) error {
	p := s.paths(a.Name)
	if err := p.makeRecords(); err != nil {
		return err
	}
	if err := renameio.WriteFile(p.Spec, raw, 0o600); err != nil {
		return err
	}
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return renameio.WriteFile(p.State, b, 0o600)
}

// makeRecords creates Root/records/NAME, root only.
func (p vmPaths) makeRecords() error {
	if err := os.MkdirAll(p.Records, 0o700); err != nil {
		return err
	}
	return os.Chmod(filepath.Dir(p.Records), 0o700)
}

// removeAll removes the VM's state directory and records (after it moved to
// another host, or when a first start failed).
func (p vmPaths) removeAll() error {
	return errors.Join(os.RemoveAll(p.Dir), os.RemoveAll(p.Records))
}

// knownVMs lists names that have a state directory.
func (s *Supervisor) knownVMs() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.opts.Root, "vms"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && spec.ValidName(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// BusyError says another vmsup command holds the VM's lock.
type BusyError struct {
	VM    string
	Op    string
	PID   int
	Since time.Time
}

func (e *BusyError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("vm %q: busy: another vmsup command holds the lock", e.VM)
	}
	return fmt.Sprintf("vm %q: busy: %s by pid %d since %s", e.VM, e.Op, e.PID, e.Since.Format(time.RFC3339))
}

// vmLock is the per-VM lock for state-changing commands. The lock file sits
// beside the VM directory so that removing the directory never races with it;
// its content names the holder for BusyError.
type vmLock = fileLock

func (s *Supervisor) lock(ctx context.Context, name, op string) (*vmLock, error) {
	dir := filepath.Join(s.opts.Root, "vms")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("vm %q: %w", name, err)
	}
	path := filepath.Join(dir, "."+name+".lock")
	l, ok, err := lockFile(ctx, path, s.opts.WaitForLock)
	if err != nil {
		return nil, fmt.Errorf("vm %q: lock: %w", name, err)
	}
	if !ok {
		return nil, readHolder(name, path)
	}
	l.setHolder(fmt.Sprintf("%s %d %d\n", op, os.Getpid(), time.Now().Unix()))
	return l, nil
}

// tryLock takes the VM's lock if it is free now; nil without error when
// another vmsup holds it.
func (s *Supervisor) tryLock(ctx context.Context, name, op string) (*vmLock, error) {
	path := filepath.Join(s.opts.Root, "vms", "."+name+".lock")
	l, ok, err := lockFile(ctx, path, false)
	if err != nil || !ok {
		return nil, err
	}
	l.setHolder(fmt.Sprintf("%s %d %d\n", op, os.Getpid(), time.Now().Unix()))
	return l, nil
}

func readHolder(name, path string) error {
	var f []string
	// The holder writes its name right after locking: give it a moment.
	for range 20 {
		b, _ := os.ReadFile(path)
		if f = strings.Fields(string(b)); len(f) == 3 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	e := &BusyError{VM: name}
	if len(f) == 3 {
		e.Op = f[0]
		e.PID, _ = strconv.Atoi(f[1])
		sec, _ := strconv.ParseInt(f[2], 10, 64)
		e.Since = time.Unix(sec, 0)
	}
	return e
}

// lockedUnit is the prologue of the commands that change whether a VM runs
// (down, migrate, rm): the systemd connection, the VM's lock (held until
// unlock) and its unit's state read under it.
type lockedUnit struct {
	sd   *units.Manager
	lk   *vmLock
	unit string
	st   units.Status
}

func (s *Supervisor) lockUnit(ctx context.Context, name, op string) (*lockedUnit, error) {
	sd, err := s.systemd(ctx)
	if err != nil {
		return nil, err
	}
	lk, err := s.lock(ctx, name, op)
	if err != nil {
		return nil, err
	}
	u := &lockedUnit{sd: sd, lk: lk, unit: s.unitOf(name)}
	if u.st, err = sd.Status(ctx, u.unit); err != nil {
		lk.unlock()
		return nil, err
	}
	return u, nil
}

func (u *lockedUnit) unlock() { u.lk.unlock() }
