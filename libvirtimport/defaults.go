package libvirtimport

import (
	"fmt"
	"slices"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// libvirt's meaning where the domain says nothing. vmsup's own defaults
// differ (-cpu host/max, -smp as cores, ACPI on, no USB, NICs without an
// option ROM); an imported VM keeps libvirt's where the VM file can say
// it, and lists the rest, once per import.

// LibvirtCPUModel is the model libvirt runs a domain with no CPU model in:
// QEMU's x86-64 default, which libvirt leaves in place.
const LibvirtCPUModel = "qemu64"

// cpuModel maps <cpu>'s mode and model. No mode with a model is libvirt's
// custom mode (its default).
func (c *converter) cpuModel(cpu *libvirtxml.DomainCPU) {
	switch cpu.Mode {
	case "host-passthrough", "maximum":
		// vmsup's default model: host under KVM, max under TCG.
	case "host-model":
		c.drop("cpu/@mode", "host-model: vmsup passes the host CPU through under KVM (host) and uses max under TCG")
	case "custom", "":
		if cpu.Model != nil && spec.ValidCPUModel(cpu.Model.Value) == nil {
			c.out.CPUModel = cpu.Model.Value
		} else if cpu.Model != nil {
			c.drop("cpu/model", "%q is not a QEMU CPU model name: %s it is", cpu.Model.Value, LibvirtCPUModel)
			c.out.CPUModel = LibvirtCPUModel
		}
	}
	if len(cpu.Features) == 0 {
		return
	}
	var fs []string
	for _, f := range cpu.Features {
		fs = append(fs, cmpOr(f.Policy, "require")+" "+f.Name)
	}
	model := c.out.CPUModel
	if model == "" {
		model = "host (KVM) or max (TCG)"
	}
	c.drop("cpu/feature", "%s: not carried over; vmsup runs %s as QEMU defines it", strings.Join(fs, ", "), model)
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// socketsDefault: without <topology> libvirt makes each vCPU slot a
// socket (-smp N,sockets=N,cores=1,threads=1); QEMU's own default for
// current machines is one socket of N cores.
func (c *converter) socketsDefault() {
	if d := c.dom; d.VCPU != nil && d.VCPU.Value > 1 {
		c.out.Topology = &fileTopology{Sockets: int(d.VCPU.Value), Cores: 1, Threads: 1}
	}
}

// platformDefaults lists what libvirt gives a guest unasked that vmsup's
// does not have: ACPI is off without <acpi/> (vmsup's guests have it: its
// power button is how vmsup stops them), libvirt's implicit USB
// controller, QEMU's option ROM (iPXE) on each NIC.
func (c *converter) platformDefaults() {
	if f := c.dom.Features; f == nil || f.ACPI == nil {
		c.note("features/acpi", "absent: libvirt runs the guest without ACPI; vmsup's guest has ACPI (vmsup stops a guest by its ACPI power button)")
	}
	dv := c.dom.Devices
	if dv == nil {
		dv = &libvirtxml.DomainDeviceList{}
	}
	usb := "libvirt's default"
	for _, ctl := range dv.Controllers {
		if ctl.Type == "usb" {
			usb = cmpOr(ctl.Model, usb)
		}
	}
	if usb != "none" {
		c.note("devices/controller (usb)", "%s USB controller: vmsup's guest has no USB controller (no USB devices in vmsup)", usb)
	}
	var roms []string
	for i, in := range dv.Interfaces {
		if in.ROM == nil || in.ROM.Bar != "off" && in.ROM.Enabled != "no" {
			roms = append(roms, fmt.Sprintf("interface[%d]", i))
		}
		if in.ROM != nil && in.ROM.File != nil && *in.ROM.File != "" {
			c.drop(fmt.Sprintf("devices/interface[%d]/rom/@file", i), "%s: vmsup's NICs have no option ROM", *in.ROM.File)
		}
	}
	if len(roms) > 0 {
		c.note("devices/interface/rom", "%s: libvirt gives each NIC QEMU's option ROM (iPXE: network boot); vmsup's NICs have none", strings.Join(roms, ", "))
	}
}

// hypervNeeds takes out the enlightenments whose prerequisites the domain
// does not turn on (QEMU would refuse them, and spec.Parse does), each
// named, so the others stay.
func (c *converter) hypervNeeds() {
	if c.out.CPU == nil {
		return
	}
	for changed := true; changed; {
		changed = false
		for _, h := range c.out.CPU.Hyperv {
			for _, need := range spec.HypervNeeds(h) {
				if slices.Contains(c.out.CPU.Hyperv, need) {
					continue
				}
				c.drop(hypervElement(h), "%q needs %q, which the domain does not turn on: not carried over (QEMU refuses it)", h, need)
				c.out.CPU.Hyperv = slices.DeleteFunc(c.out.CPU.Hyperv, func(v string) bool { return v == h })
				changed = true
				break
			}
			if changed {
				break
			}
		}
	}
	if len(c.out.CPU.Hyperv) == 0 {
		c.out.CPU = nil
	}
}

// hypervElement is the <hyperv> child an enlightenment comes from.
func hypervElement(h string) string {
	switch h {
	case "time":
		return "clock/timer (hypervclock)"
	case "stimer-direct":
		return "features/hyperv/stimer/direct"
	case "tlbflush-direct":
		return "features/hyperv/tlbflush/direct"
	case "tlbflush-ext":
		return "features/hyperv/tlbflush/extended"
	}
	return "features/hyperv/" + strings.ReplaceAll(h, "-", "_")
}
