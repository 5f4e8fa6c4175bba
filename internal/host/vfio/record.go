package vfio

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// Take binds the devices addrs to vfio-pci, after writing what each had to
// the file record (0600, its directory made): a GiveBack after a crash
// then still knows where each goes back. A failed Take leaves the record
// for GiveBack, the caller's undo.
func (h Host) Take(record string, addrs []string) error {
	var rec []Binding
	for _, a := range addrs {
		b, err := h.Before(a)
		if err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
		rec = append(rec, b)
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(record, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("record the devices' drivers before binding them: %w", err)
	}
	for _, b := range rec {
		if err := h.Bind(b); err != nil {
			return err
		}
	}
	return nil
}

// A record holds addresses in sysfs's form only, and driver names (a
// directory under /sys/bus/pci/drivers): anything else is not written.
var (
	fullAddr   = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	driverName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)
)

// GiveBack restores every device the file record names (Restore) and
// removes the record once all are back; no record: nothing to do. It is
// idempotent.
func (h Host) GiveBack(record string) error {
	data, err := os.ReadFile(record)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var rec []Binding
	if err := json.Unmarshal(data, &rec); err != nil {
		return fmt.Errorf("%s: %w", record, err)
	}
	var errs []error
	for _, b := range rec {
		if !fullAddr.MatchString(b.Address) || (b.Driver != "" && !driverName.MatchString(b.Driver)) || strings.Contains(b.Driver, "..") {
			errs = append(errs, fmt.Errorf("%s: %q (driver %q) is not a PCI address and driver", record, b.Address, b.Driver))
			continue
		}
		errs = append(errs, h.Restore(b))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(record)
}

// TakeOne binds one more device (a hot-plugged one) to vfio-pci, after
// adding what it had to the record the VM's others are in; GiveBack then
// gives back all of them, GiveBackOne this one.
func (h Host) TakeOne(record, addr string) error {
	rec, err := readRecord(record)
	if err != nil {
		return err
	}
	b, err := h.Before(addr)
	if err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	if !slices.ContainsFunc(rec, func(r Binding) bool { return r.Address == addr }) {
		if err := writeRecord(record, append(rec, b)); err != nil {
			return err
		}
	}
	return h.Bind(b)
}

// GiveBackOne gives the device addr back as the record says and drops it
// from the record (removed when empty); a device not in it is left alone.
func (h Host) GiveBackOne(record, addr string) error {
	rec, err := readRecord(record)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(rec, func(r Binding) bool { return r.Address == addr })
	if i < 0 {
		return nil
	}
	if err := h.Restore(rec[i]); err != nil {
		return err
	}
	rec = slices.Delete(rec, i, i+1)
	if len(rec) == 0 {
		return os.Remove(record)
	}
	return writeRecord(record, rec)
}

func readRecord(record string) ([]Binding, error) {
	data, err := os.ReadFile(record)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec []Binding
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", record, err)
	}
	return rec, nil
}

func writeRecord(record string, rec []Binding) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(record, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("record the devices' drivers before binding them: %w", err)
	}
	return nil
}
