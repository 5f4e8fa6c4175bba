package vmstore

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
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// Store is the state root.
type Store struct{ Root string }

// Paths are the files of one VM: what QEMU uses under ROOT/vms/NAME (Dir,
// which the QEMU user owns while the VM runs), and vmsup's own records under
// ROOT/records/NAME (root only).
type Paths struct {
	Dir, QMP, Events, Console, ConsoleLog, Agent, QMPLock, UEFIVars string
	Records, Spec, State                                            string
}

// Paths returns the files of the VM called name.
func (s Store) Paths(name string) Paths {
	d := filepath.Join(s.Root, "vms", name)
	r := filepath.Join(s.Root, "records", name)
	return Paths{
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

// Records of a VM beside state.json, all root only.
func (p Paths) NetState() string  { return filepath.Join(p.Records, "net.json") }  // the network record
func (p Paths) NetLock() string   { return filepath.Join(p.Records, "net.lock") }  // its lock
func (p Paths) CNICache() string  { return filepath.Join(p.Records, "cni-cache") } // libcni's cache
func (p Paths) AgentLock() string { return filepath.Join(p.Records, "agent.lock") }

// HostDevs records the drivers the VM's host PCI devices had before vmsup
// bound them to vfio-pci (written before binding), root only: a QEMU that
// could edit it could have vmsup rebind any host device.
func (p Paths) HostDevs() string { return filepath.Join(p.Records, "hostdev.json") }

// Snapshots is the VM's snapshot tree (internal/vm/snapshottree), root only;
// SnapshotState the file holding a memory snapshot's RAM and device state,
// written and read by QEMU only through a descriptor vmsup opens.
func (p Paths) Snapshots() string { return filepath.Join(p.Records, "snapshots.json") }
func (p Paths) SnapshotState(tag string) string {
	return filepath.Join(p.Records, "snapshots", tag+".state")
}

// EventHistory is the VM's event history (internal/vm/eventlog), root only.
func (p Paths) EventHistory() string { return filepath.Join(p.Records, "events.log") }

// KillMark is written before vmsup kills the VM's QEMU, so that its end is
// recorded as stopped (killed by vmsup), not crashed.
func (p Paths) KillMark() string { return filepath.Join(p.Records, "kill-requested") }

// EventLog is the base path of a fresh start's QEMU event log (.in, .out),
// in the state directory QEMU's user owns.
func (p Paths) EventLog() string { return filepath.Join(p.Dir, "events") }

// Handover marks a local migration's handover: the old QEMU is quitting
// and a new one already runs the guest with the same host resources.
func (p Paths) Handover() string { return filepath.Join(p.Records, "handover") }

// StoppedByMigration marks a source whose vCPUs vmsup stopped for a
// stop-and-copy migration, until that migration has ended.
func (p Paths) StoppedByMigration() string { return filepath.Join(p.Records, "stopped-by-migration") }

// VNC is the VM's VNC server's socket ([display]), in the state directory
// QEMU's user owns; only root may reach it (the directory's mode).
func (p Paths) VNC() string { return filepath.Join(p.Dir, "vnc.sock") }

// CPR is where a cpr-transfer destination's QEMU takes the source's
// guest RAM (its cpr channel): in its incoming directory, which only the
// VM's QEMU user and root may reach.
func (p Paths) CPR() string { return filepath.Join(p.Dir, "cpr.sock") }

// Screendump is where QEMU writes a screenshot (QMP screendump) for vmsup
// to read and remove: a file QEMU's user may create.
func (p Paths) Screendump() string { return filepath.Join(p.Dir, "screendump.ppm") }

// RemoveSockets removes the sockets a dead QEMU may have left behind (QEMU
// killed by a signal cannot unlink them).
func (p Paths) RemoveSockets() error {
	for _, sock := range []string{p.QMP, p.Events, p.Console, p.Agent, p.VNC()} {
		if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// MakeRecords creates ROOT/records/NAME, root only.
func (p Paths) MakeRecords() error {
	if err := os.MkdirAll(p.Records, 0o700); err != nil {
		return err
	}
	return os.Chmod(filepath.Dir(p.Records), 0o700)
}

// RemoveAll removes the VM's state directory and records (after it moved to
// another host, or when a first start failed).
func (p Paths) RemoveAll() error {
	return errors.Join(os.RemoveAll(p.Dir), os.RemoveAll(p.Records))
}

// File is the VM file vmsup wrote for a VM that came without one (a
// clone): ROOT/files/NAME.toml, the file the VM belongs to until the
// operator adopts another.
func (s Store) File(name string) string { return filepath.Join(s.Root, "files", name+".toml") }

// Applied is what vmsup recorded when it last started a VM: enough to tell a
// changed spec from an unchanged one and to say how the VM was started.
type Applied struct {
	Name        string          `json:"name"`
	SourceFile  string          `json:"source_file"`
	Spec        json.RawMessage `json:"spec"` // canonical form of the parsed spec
	Accel       spec.Accel      `json:"accel"`
	AccelReason string          `json:"accel_reason,omitempty"`
	// CPUModel and CPUMasks are the -cpu model the host probe chose when
	// the spec names none, and the features turned off for this host's KVM.
	CPUModel string   `json:"cpu_model,omitempty"`
	CPUMasks []string `json:"cpu_masks,omitempty"`
	// Machine is the versioned machine type the VM runs, pinned at its
	// first start and kept by every later one (identity.PinMachine).
	Machine string `json:"machine,omitempty"`
	// UUID and GenID are the VM's UUID (the file's, or generated at its
	// first start) and vmgenid generation id, kept from start to start.
	UUID      string    `json:"uuid,omitempty"`
	GenID     string    `json:"genid,omitempty"`
	Argv      []string  `json:"argv"`
	StartedAt time.Time `json:"started_at"`
	// AttachedNICs were hot-plugged into the running VM (vmsup nic attach),
	// in order; Spec stays what the VM booted with.
	AttachedNICs []spec.NIC `json:"attached_nics,omitempty"`
	// Attached are the disks hot-plugged with `vmsup disk attach` (and kept
	// over restarts); HotplugPorts the root ports left empty at boot.
	Attached     []AttachedDisk `json:"attached_disks,omitempty"`
	HotplugPorts []string       `json:"hotplug_ports,omitempty"`
	// Moved are the disks of the VM's file moved by `vmsup disk move`, by
	// name: the next boot uses these instead of the file's, for as long as
	// the file still names the source they were moved from.
	Moved map[string]MovedDisk `json:"moved_disks,omitempty"`
	// AttachedHostDevs are host PCI devices hot-plugged into this run
	// (vmsup hostdev attach): live only, given back when QEMU ends.
	AttachedHostDevs []AttachedHostDev `json:"attached_hostdevs,omitempty"`
	// Unit is the systemd unit running the VM when it is not the usual
	// vmsup-NAME.service: after a migration on one host the new QEMU runs
	// under the other of the two names (AltUnit). "" means the usual.
	Unit string `json:"unit,omitempty"`
	// MigratedFrom says where the running QEMU came from ("local" or a
	// host), empty for a VM started by up.
	MigratedFrom string `json:"migrated_from,omitempty"`
	// Resized: vCPUs and memory changed live (vmsup set), for this run.
	Resized *Resized `json:"resized,omitempty"`
	// Replugged: vmsup apply plugged or unplugged devices of the file since
	// boot, so the device layout is no longer what Spec would boot with.
	Replugged bool `json:"replugged,omitempty"`
	// EventLog is the base path of the running QEMU's event log: QEMU
	// reads EventLog.in (qmp_capabilities) and appends every QMP event to
	// EventLog.out, with no client connected (qemuargs.Options.EventLog).
	EventLog string `json:"event_log,omitempty"`
	// VsockCID is the guest's vsock context id (spec [vsock]), allocated
	// and held for the VM until vmsup rm (internal/lifecycle/vsock).
	VsockCID uint32 `json:"vsock_cid,omitempty"`
	// Hugetlbfs is the hugetlbfs mount the guest's memory is on (spec
	// hugepages); a hot-plugged DIMM goes there too.
	Hugetlbfs string `json:"hugetlbfs,omitempty"`
	// RAM is how the running QEMU holds the guest's memory
	// (qemuargs.RAMOf): the name of its RAM block, which a migration
	// destination takes from its source, and whether a new QEMU can take
	// the memory over in place (shared, for cpr-transfer). nil: started
	// before vmsup recorded it (the name follows its spec; not shared).
	RAM *qemuargs.RAM `json:"ram,omitempty"`
	// Generation counts the specs recorded for the VM: each start and each
	// apply that changed the running VM adds one.
	Generation int `json:"generation,omitempty"`
}

// AttachedHostDev is a host PCI device hot-plugged into a running VM, on
// root port Bus.
type AttachedHostDev struct {
	Dev spec.HostDev `json:"dev"`
	Bus string       `json:"bus"`
}

// AttachedDisk is a disk hot-plugged into a running VM, recorded in the
// applied state so that status shows it and the next up boots with it.
type AttachedDisk struct {
	Disk spec.Disk `json:"disk"`
	// Bus is the root port (q35) or "pci.0" (pc) it was plugged into while
	// the VM runs; "" once a later up made it a boot-time disk.
	Bus string `json:"bus,omitempty"`
	// FDSet is the QEMU fd set holding a hot-plugged block device that
	// vmsup opened for QEMU; removed on detach.
	FDSet *int64 `json:"fdset,omitempty"`
}

// MovedDisk is a disk of the VM's file that `vmsup disk move` put
// elsewhere: From is where the file says it is (its path, or
// rbd:POOL/IMAGE), Disk what the VM now runs with.
type MovedDisk struct {
	From string    `json:"from"`
	Disk spec.Disk `json:"disk"`
}

// Resized is what a live resize changed, kept while its QEMU runs.
type Resized struct {
	CPUs   int       `json:"cpus"`
	Memory spec.Size `json:"memory"`
}

// Canonical is the form of a parsed spec that Applied records and compares.
func Canonical(vm *spec.VM) json.RawMessage {
	b, err := json.Marshal(vm)
	if err != nil { // spec.VM holds only plain values
		panic(err)
	}
	return b
}

// ReadApplied reads the VM's record.
func (s Store) ReadApplied(name string) (*Applied, error) {
	p := s.Paths(name)
	b, err := os.ReadFile(p.State)
	if err != nil {
		return nil, err
	}
	var a Applied
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("vm %q: %s: %w", name, p.State, err)
	}
	return &a, nil
}

// WriteApplied stores the spec copy and the record atomically (each file is
// replaced by rename, so a crash leaves the old or the new, never half).
func (s Store) WriteApplied(a *Applied, raw []byte) error {
	p := s.Paths(a.Name)
	if err := p.MakeRecords(); err != nil {
		return err
	}
	if err := p.writeRecord(p.Spec, raw); err != nil {
		return err
	}
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return p.writeRecord(p.State, b)
}

// writeRecord replaces a record file. On a full filesystem an operation in
// progress gives its reserve back (op.go) and the write is tried again: the
// record that finishes an operation must not be the write that fails.
func (p Paths) writeRecord(path string, b []byte) error {
	err := atomicfile.WriteFile(path, b, 0o600)
	if errors.Is(err, syscall.ENOSPC) {
		if os.Remove(p.reserveFile()) == nil {
			err = atomicfile.WriteFile(path, b, 0o600)
		}
	}
	return err
}

// WriteRecord replaces one of the VM's records (path, under its records
// directory) atomically, with the operation's reserve given back if the
// filesystem is full.
func (p Paths) WriteRecord(path string, b []byte) error { return p.writeRecord(path, b) }

// RewriteApplied stores a changed record beside the unchanged spec copy.
func (s Store) RewriteApplied(a *Applied) error {
	raw, err := os.ReadFile(s.Paths(a.Name).Spec)
	if err != nil {
		return err
	}
	return s.WriteApplied(a, raw)
}

// Known lists the names that have a state directory.
func (s Store) Known() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.Root, "vms"))
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

// UnitName is the systemd unit of the VM called vm.
func UnitName(vm string) string { return "vmsup-" + vm + ".service" }

// UnitDescription is the Description= of the VM's unit: what tells a unit
// vmsup made for a VM from its other units (vmsup-api.service...).
func UnitDescription(vm string) string { return "vmsup VM " + vm }

// SettleUnit is the unit of the guardian that settles an operation whose
// command died (supervisor: guard). "@" keeps it out of the VM list.
func SettleUnit(vm string) string { return "vmsup-" + vm + "@settle.service" }

// AltUnit is the unit a local migration's new QEMU runs under: the other of
// the VM's two names. A unit name cannot change while its process lives, so
// the VM alternates between vmsup-NAME.service and
// vmsup-NAME@migrated.service, and Applied.Unit records which is current.
func AltUnit(vm, cur string) string {
	if cur == UnitName(vm) {
		return "vmsup-" + vm + "@migrated.service"
	}
	return UnitName(vm)
}

// ProfileName is the AppArmor profile of the VM called vm.
func ProfileName(vm string) string { return "vmsup-" + vm }

// UnitOf returns the unit that runs (or last ran) the VM: the name recorded
// by a migration, else vmsup-NAME.service. Only the VM's two names are
// accepted, whatever the record says.
func (s Store) UnitOf(name string) string {
	usual := UnitName(name)
	if a, err := s.ReadApplied(name); err == nil && a.Unit == AltUnit(name, usual) {
		return a.Unit
	}
	return usual
}

// BusyError says another vmsup command holds the VM's lock.
type BusyError struct {
	VM    string
	Op    string
	PID   int
	Since time.Time
}

// VMName says which VM is busy.
func (e *BusyError) VMName() string { return e.VM }

func (e *BusyError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("vm %q: busy: another vmsup command holds the lock", e.VM)
	}
	return fmt.Sprintf("vm %q: busy: %s by pid %d since %s", e.VM, e.Op, e.PID, e.Since.Format(time.RFC3339))
}

// Lock takes the VM's lock for state-changing command op: with wait until
// ctx ends, else once; a *BusyError names the holder. The lock file sits
// beside the VM's directory so that removing the directory never races
// with it; its content names the holder.
func (s Store) Lock(ctx context.Context, name, op string, wait bool) (*FileLock, error) {
	if err := NotVM(name); err != nil {
		return nil, err // every command that acts on a VM locks it first
	}
	dir := filepath.Join(s.Root, "vms")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, vmerr.Wrap(name, err)
	}
	path := filepath.Join(dir, "."+name+".lock")
	l, ok, err := LockFile(ctx, path, wait)
	if err != nil {
		return nil, fmt.Errorf("vm %q: lock: %w", name, err)
	}
	if !ok {
		err := readHolder(name, path)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("interrupted while waiting for the lock: %w", err)
		}
		return nil, err
	}
	l.SetHolder(fmt.Sprintf("%s %d %d\n", op, os.Getpid(), time.Now().Unix()))
	p := s.Paths(name)
	l.drop = func() bool { return !exists(p.Dir) && !exists(p.Records) } // rm, or a failed first up
	return l, nil
}

// TryLock takes the VM's lock if it is free now; nil without an error when
// another vmsup holds it.
func (s Store) TryLock(ctx context.Context, name, op string) (*FileLock, error) {
	l, err := s.Lock(ctx, name, op, false)
	var busy *BusyError
	if errors.As(err, &busy) {
		return nil, nil
	}
	return l, err
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

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
