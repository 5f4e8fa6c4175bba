package vfio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Binding is what Bind changed on one device, all Restore needs to give it
// back: the caller records it before Bind acts, so a restore after a
// crash finds it.
type Binding struct {
	Address string `json:"address"`
	// Driver is the driver the device had ("" none); vfio-pci: it was
	// already bound, and Restore leaves it so.
	Driver string `json:"driver,omitempty"`
	// Override is the device's driver_override before ("" none).
	Override string `json:"override,omitempty"`
}

// Before reads what Bind would change on addr, touching nothing: the
// record to write before binding.
func (h Host) Before(addr string) (Binding, error) {
	if err := h.exists(addr); err != nil {
		return Binding{}, err
	}
	drv, err := h.Driver(addr)
	if err != nil {
		return Binding{}, err
	}
	ov, err := h.override(addr)
	return Binding{Address: addr, Driver: drv, Override: ov}, err
}

// override reads driver_override ("(null)" is none).
func (h Host) override(addr string) (string, error) {
	b, err := os.ReadFile(filepath.Join(h.deviceDir(addr), "driver_override"))
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "(null)" {
		s = ""
	}
	return s, nil
}

// Bind gives the device addr to vfio-pci: driver_override, an unbind from
// its driver, then a probe, which only vfio-pci may now take. It checks
// that vfio-pci did; on failure the device is given back as b says.
func (h Host) Bind(b Binding) error {
	addr := b.Address
	drv, err := h.Driver(addr)
	if err != nil {
		return err
	}
	if drv == DriverVFIO {
		return nil
	}
	err = h.bind(addr, drv)
	if err == nil {
		if now, _ := h.Driver(addr); now != DriverVFIO {
			err = fmt.Errorf("bound to %q after the probe, not %s", now, DriverVFIO)
		}
	}
	if err != nil {
		return errors.Join(fmt.Errorf("%s: bind to %s: %w", addr, DriverVFIO, err), h.Restore(b))
	}
	return nil
}

func (h Host) bind(addr, drv string) error {
	if err := h.write(filepath.Join(h.deviceDir(addr), "driver_override"), DriverVFIO); err != nil {
		return err
	}
	if drv != "" {
		if err := h.write(h.sys("bus", "pci", "drivers", drv, "unbind"), addr); err != nil {
			return fmt.Errorf("unbind from %s: %w", drv, err)
		}
	}
	return h.write(h.sys("bus", "pci", "drivers_probe"), addr)
}

// Restore gives the device back as b says: driver_override as it was, off
// vfio-pci, and bound to its previous driver (left unbound if it had none).
// It is idempotent, and a device that is gone has nothing to give back.
func (h Host) Restore(b Binding) error {
	addr := b.Address
	if b.Driver == DriverVFIO {
		return nil // vmsup did not bind it
	}
	if h.exists(addr) != nil {
		return nil
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("%s: give back to %q: %s: %w", addr, b.Driver, what, err)
	}
	ov, err := h.override(addr)
	if err != nil {
		return fail("driver_override", err)
	}
	if ov != b.Override {
		// "\n" clears it, as `echo > driver_override` does.
		if err := h.write(filepath.Join(h.deviceDir(addr), "driver_override"), b.Override+"\n"); err != nil {
			return fail("driver_override", err)
		}
	}
	cur, err := h.Driver(addr)
	if err != nil {
		return fail("driver", err)
	}
	if cur == b.Driver {
		return nil
	}
	if cur != "" {
		if err := h.write(h.sys("bus", "pci", "drivers", cur, "unbind"), addr); err != nil {
			return fail("unbind from "+cur, err)
		}
	}
	if b.Driver == "" {
		return nil
	}
	if err := h.write(h.sys("bus", "pci", "drivers", b.Driver, "bind"), addr); err != nil {
		return fail("bind", err)
	}
	return nil
}
