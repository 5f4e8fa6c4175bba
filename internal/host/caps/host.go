package caps

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Host is the summary of the host facts the start path depends on: from a
// probe (Caps.Host), or given by tests and embedders without one.
type Host struct {
	MemTotal int64 // bytes of RAM
	// KVMUnusable is "" when KVM can run a stock guest, else why not ("no
	// /dev/kvm", "PVM: runs only PVM guest kernels", ...).
	KVMUnusable string
	// KVMOpenable: QEMU starts under KVM (even if it cannot run a stock
	// guest, as on PVM hosts).
	KVMOpenable bool
	// AppArmorUnusable is "" when the kernel enforces AppArmor and
	// apparmor_parser is there, else why not.
	AppArmorUnusable string
	// PhysBits is the host CPU's physical address width (0: unknown):
	// the guest's under KVM with -cpu host or max (qemuargs.GuestPhysBits).
	PhysBits int
	AMD      bool // the host CPU is AMD's (its address space's HyperTransport hole)
}

// ProbeHost reads the host facts from /proc, /sys and /dev, without asking
// QEMU (Probe does).
func ProbeHost() Host {
	h := Host{MemTotal: MemTotal(), AppArmorUnusable: AppArmorReason(), PhysBits: PhysBits(), AMD: hostAMD()}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	switch {
	case err != nil:
		h.KVMUnusable = "cannot open /dev/kvm: " + errors.Unwrap(err).Error()
		if errors.Is(err, os.ErrNotExist) {
			h.KVMUnusable = "no /dev/kvm"
		}
	default:
		f.Close()
		h.KVMOpenable = true
		if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
			h.KVMUnusable = "/dev/kvm is PVM (kvm_pvm), which runs only PVM guest kernels"
		}
	}
	return h
}

// Host summarizes the record.
func (c *Caps) Host() Host {
	h := Host{MemTotal: MemTotal(), AppArmorUnusable: c.Facts.AppArmor.Reason, PhysBits: PhysBits(), AMD: hostAMD()}
	h.KVMOpenable, h.KVMUnusable = c.KVM.Starts()
	if h.KVMOpenable && c.KVM.Kind != KVMFull {
		h.KVMUnusable = c.KVM.Reason
	}
	return h
}

// Accel turns the spec's accelerator choice into kvm or tcg from the facts
// alone, with the reason when it is not what the user might expect.
func (h Host) Accel(f *spec.File) (spec.Accel, string, error) {
	switch f.VM.Accel {
	case spec.AccelKVM:
		if !h.KVMOpenable {
			return "", "", f.Errorf("accel", "kvm requested but %s", h.KVMUnusable)
		}
		return spec.AccelKVM, h.KVMUnusable, nil
	case spec.AccelTCG:
		return spec.AccelTCG, "", nil
	default:
		if h.KVMUnusable == "" && h.KVMOpenable {
			return spec.AccelKVM, "", nil
		}
		return spec.AccelTCG, "auto chose tcg: " + h.KVMUnusable, nil
	}
}

// Resolved is what a VM runs with on this host.
type Resolved struct {
	Accel spec.Accel
	Why   string // why the accelerator is not what the user might expect, and the masks
	Model string // the -cpu model
	// Machine is the versioned type this QEMU runs for the spec's machine
	// (its alias resolved); a VM keeps the one of its first start
	// (internal/lifecycle/identity.PinMachine).
	Machine string
	Masks   []string // features turned off for this host's KVM
}

// Resolve turns the spec's machine, accelerator and CPU model into what this
// host runs. Errors name the field and say what would work instead.
func (c *Caps) Resolve(f *spec.File) (Resolved, error) {
	if err := c.Check(); err != nil {
		return Resolved{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	machine, err := c.MachineType(f.VM.Machine)
	if err != nil {
		return Resolved{}, f.Errorf("machine", "%v", err)
	}
	accel, why, err := c.Accel(f.VM.Accel)
	if err != nil {
		return Resolved{}, f.Errorf("accel", "%v", err)
	}
	model, masks, err := c.CPU(accel, f.VM.CPUModel)
	if err != nil {
		field := "cpu_model"
		if f.VM.CPUModel == "" {
			field = "accel"
		}
		return Resolved{}, f.Errorf(field, "%v", err)
	}
	if len(masks) > 0 {
		why = strings.TrimPrefix(why+"; ", "; ") + fmt.Sprintf("-cpu %s with %s off (this KVM refuses it otherwise)", model, strings.Join(masks, ", "))
	}
	return Resolved{Accel: accel, Why: why, Model: model, Masks: masks, Machine: machine}, nil
}
