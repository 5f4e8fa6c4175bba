package vmstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/vmsup/vmsup/spec"
)

// VM decodes the spec the running QEMU realizes (Spec): what it booted
// with, plus what apply changed live. Keys added to vmsup since the record
// was written get their defaults.
func (a *Applied) VM() (*spec.VM, error) {
	var vm spec.VM
	if err := json.Unmarshal(a.Spec, &vm); err != nil {
		return nil, fmt.Errorf("vm %q: its record: %w", a.Name, err)
	}
	vm.FillDefaults()
	return &vm, nil
}

// Running is VM with the live resizes of vmsup set (Resized) applied: the
// vCPUs and memory the guest has now.
func (a *Applied) Running() (*spec.VM, error) {
	vm, err := a.VM()
	if err != nil {
		return nil, err
	}
	if r := a.Resized; r != nil {
		vm.CPUs, vm.Memory = r.CPUs, r.Memory
	}
	return vm, nil
}

// SetVM records vm as what the running QEMU realizes.
func (a *Applied) SetVM(vm *spec.VM) { a.Spec = Canonical(vm) }

// RecordVM stores vm as what the VM runs with: the record and the spec copy
// (as TOML, which the stop hook and a restart's rollback read).
func (s Store) RecordVM(a *Applied, vm *spec.VM) error {
	raw, err := toml.Marshal(vm)
	if err != nil {
		return err
	}
	a.SetVM(vm)
	a.Generation++
	return s.WriteApplied(a, raw)
}

// Pending is a change of the VM's file that apply could not make live: it
// waits for a restart, or (AtReboot) for the guest's own next reboot, when
// the stop hook starts the VM again from Raw.
type Pending struct {
	SourceFile string    `json:"source_file"`
	Raw        []byte    `json:"raw"`
	AtReboot   bool      `json:"at_reboot"`
	Since      time.Time `json:"since"`
	Changes    []string  `json:"changes"` // the plan's lines, for status
}

// PendingFile is where the VM's pending change is recorded.
func (p Paths) PendingFile() string { return filepath.Join(p.Records, "pending.json") }

// ReadPending returns the VM's pending change, or nil.
func (s Store) ReadPending(name string) (*Pending, error) {
	b, err := os.ReadFile(s.Paths(name).PendingFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pd Pending
	if err := json.Unmarshal(b, &pd); err != nil {
		return nil, fmt.Errorf("vm %q: pending change: %w", name, err)
	}
	return &pd, nil
}

// WritePending records the VM's pending change (replacing one before).
func (s Store) WritePending(name string, pd *Pending) error {
	p := s.Paths(name)
	b, err := json.MarshalIndent(pd, "", "  ")
	if err != nil {
		return err
	}
	return p.writeRecord(p.PendingFile(), b)
}

// ClearPending forgets the VM's pending change (a new QEMU runs its file).
func (s Store) ClearPending(name string) error {
	if err := os.Remove(s.Paths(name).PendingFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// AsMoved is running (the spec as recorded at the VM's start) with the
// disks `vmsup disk move` put on a new image as they run now, for a file
// that no longer names the image a disk was moved from: edited to name
// the new one (as the move's note asks), compared with the old image it
// showed a restart; naming a third, the change is from where the disk
// runs. A file that still names the old image runs as it is (the next up
// boots from the new one), so that disk stays. The keys that only make an
// image (its backing, a stored image's overlay) are the file's: they did
// nothing on the moved, existing image and are not where it runs; its
// size is the old image's, which the copy has.
func AsMoved(running *spec.VM, moved map[string]MovedDisk, file *spec.VM) *spec.VM {
	if len(moved) == 0 {
		return running
	}
	out := *running
	out.Disks = slices.Clone(running.Disks)
	for i, d := range out.Disks {
		mv, ok := moved[d.Name]
		if !ok || mv.From != DiskSource(d) {
			continue
		}
		j := slices.IndexFunc(file.Disks, func(w spec.Disk) bool { return w.Name == d.Name })
		if j < 0 || DiskSource(file.Disks[j]) == mv.From {
			continue
		}
		now := mv.Disk
		if now.Type == spec.DiskFile {
			now.Backing, now.Image = file.Disks[j].Backing, file.Disks[j].Image
			if now.Size == 0 {
				now.Size = d.Size
			}
		}
		out.Disks[i] = now
	}
	return &out
}
