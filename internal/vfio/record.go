package vfio

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/renameio/v2"
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
	if err := renameio.WriteFile(record, append(data, '\n'), 0o600); err != nil {
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
