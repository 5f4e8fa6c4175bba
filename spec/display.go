package spec

import (
	"fmt"
	"slices"
	"strings"
)

// Display is a graphical console: a video device, a VNC server on a unix
// socket in the VM's state directory (never a host TCP port; vmsup vnc and
// vmsup console --web hand it to a client for one session) and a USB
// tablet for absolute pointing. Unset ([display] absent): no video device,
// no VNC server, the serial console only.
type Display struct {
	// Video is the guest's video device: "std" (default: QEMU's VGA,
	// what every firmware and OS drives), "virtio" (virtio-vga), "bochs"
	// (bochs-display: no legacy VGA, UEFI guests), "qxl" (qxl-vga) or
	// "none" (a VNC server with nothing to show, for a guest that draws
	// nothing).
	Video string `toml:"video"`
	// VNC serves the screen on the state directory's vnc.sock; default true.
	VNC *bool `toml:"vnc"`
	// Tablet adds a USB tablet (on its own qemu-xhci controller), so a VNC
	// pointer lands where it is on the guest's screen; default true.
	Tablet *bool `toml:"tablet"`
	// Password makes the VNC server ask for a password: vmsup sets a
	// one-time one for each session (QMP set_password, expire_password)
	// and there is none between sessions. Unset: the socket's permissions
	// (root only) are the only gate.
	Password bool `toml:"password"`
}

// Video devices.
const (
	VideoStd    = "std"
	VideoVirtio = "virtio"
	VideoBochs  = "bochs"
	VideoQXL    = "qxl"
	VideoNone   = "none"
)

// VideoDevices are the video values, in the order the errors list them.
var VideoDevices = []string{VideoStd, VideoVirtio, VideoBochs, VideoQXL, VideoNone}

// HasVNC reports whether the VM serves VNC on its socket.
func (d *Display) HasVNC() bool { return d != nil && (d.VNC == nil || *d.VNC) }

// HasTablet reports whether the VM has a USB tablet.
func (d *Display) HasTablet() bool { return d != nil && (d.Tablet == nil || *d.Tablet) }

// HasVideo reports whether the VM has a video device.
func (d *Display) HasVideo() bool { return d != nil && d.Video != VideoNone }

// CPUFeatures are the [cpu] table: what the guest's CPU offers beyond its
// model.
type CPUFeatures struct {
	// Hyperv are the Hyper-V enlightenments (paravirtual interfaces Windows
	// uses to run well under a hypervisor): true gives DefaultHyperv (the
	// set libvirt's and Proxmox's Windows templates use), a list names
	// them (HypervFeatures), false or unset none. KVM implements them;
	// under TCG QEMU has none (it refuses hv-vpindex), so a VM that runs
	// under TCG gets none either.
	Hyperv any `toml:"hyperv"`
}

// HypervFeatures are the enlightenments QEMU 7.2 offers by their names
// without QEMU's "hv-" prefix, in the order the argv gives them.
var HypervFeatures = []string{
	"relaxed", "vapic", "spinlocks", "vpindex", "runtime", "synic", "stimer", "stimer-direct",
	"frequencies", "reset", "time", "tlbflush", "tlbflush-ext", "tlbflush-direct", "ipi",
	"crash", "reenlightenment", "avic", "xmm-input", "emsr-bitmap",
}

// DefaultHyperv is what hyperv = true gives.
var DefaultHyperv = []string{
	"relaxed", "vapic", "spinlocks", "vpindex", "runtime", "synic", "stimer",
	"frequencies", "reset", "time", "tlbflush", "ipi",
}

// hypervNeeds are the enlightenments each needs (QEMU's KVM checks them at
// start, with a less direct message).
var hypervNeeds = map[string][]string{
	"synic":           {"vpindex"},
	"stimer":          {"synic", "time"},
	"stimer-direct":   {"stimer"},
	"tlbflush":        {"vpindex"},
	"tlbflush-ext":    {"tlbflush"},
	"tlbflush-direct": {"vapic"},
	"ipi":             {"vpindex"},
}

// HypervNeeds are the enlightenments h needs.
func HypervNeeds(h string) []string { return slices.Clone(hypervNeeds[h]) }

// HypervSpinlocks is the spinlock retry count hv-spinlocks gets (libvirt's
// and Proxmox's 0x1fff).
const HypervSpinlocks = 0x1fff

// HypervList returns the enlightenments the file asks for, in
// HypervFeatures' order; nil for none. ok is false for a value that is
// neither a bool nor a list of strings (validate reports it).
func (c CPUFeatures) HypervList() (list []string, ok bool) {
	switch v := c.Hyperv.(type) {
	case nil:
		return nil, true
	case bool:
		if v {
			return slices.Clone(DefaultHyperv), true
		}
		return nil, true
	case []string:
		list = slices.Clone(v)
	case []any:
		for _, x := range v {
			s, isStr := x.(string)
			if !isStr {
				return nil, false
			}
			list = append(list, s)
		}
	default:
		return nil, false
	}
	slices.SortStableFunc(list, func(a, b string) int {
		return slices.Index(HypervFeatures, a) - slices.Index(HypervFeatures, b)
	})
	return slices.Compact(list), true
}

// RTC bases.
const (
	RTCUTC       = "utc"
	RTCLocalTime = "localtime" // Windows keeps the hardware clock in local time
)

func (f *File) validateDisplay() error {
	d := f.VM.Display
	if d == nil {
		return nil
	}
	if !slices.Contains(VideoDevices, d.Video) {
		return f.Errorf("display.video", "unknown video device %q (want %s)", d.Video, quoted(VideoDevices))
	}
	if d.Password && !d.HasVNC() {
		return f.Errorf("display.password", "needs the VNC server (vnc = false)")
	}
	return nil
}

func (f *File) validateCPUFeatures() error {
	vm := &f.VM
	switch vm.RTC {
	case RTCUTC, RTCLocalTime:
	default:
		return f.Errorf("rtc", "unknown base %q (want \"utc\" or \"localtime\")", vm.RTC)
	}
	list, ok := vm.CPU.HypervList()
	if !ok {
		return f.Errorf("cpu.hyperv", "want true, false or a list of enlightenments (%s)", quoted(HypervFeatures))
	}
	for _, h := range list {
		if !slices.Contains(HypervFeatures, strings.TrimPrefix(h, "hv-")) {
			return f.Errorf("cpu.hyperv", "unknown enlightenment %q (QEMU 7.2 has %s)", h, quoted(HypervFeatures))
		}
		if strings.HasPrefix(h, "hv-") {
			return f.Errorf("cpu.hyperv", "%q: write it without QEMU's \"hv-\" prefix (%q)", h, strings.TrimPrefix(h, "hv-"))
		}
		for _, need := range hypervNeeds[h] {
			if !slices.Contains(list, need) {
				return f.Errorf("cpu.hyperv", "%q needs %q", h, need)
			}
		}
	}
	if len(list) > 0 && vm.Accel == AccelTCG {
		return f.Errorf("cpu.hyperv", "needs KVM: under accel \"tcg\" QEMU has no Hyper-V enlightenments (use accel \"auto\" or \"kvm\")")
	}
	return nil
}

// quoted lists values for an error: "a", "b" or "c".
func quoted(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = fmt.Sprintf("%q", v)
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

func (vm *VM) displayDefaults() {
	if vm.Display != nil && vm.Display.Video == "" {
		vm.Display.Video = VideoStd
	}
	if vm.RTC == "" {
		vm.RTC = RTCUTC
	}
	if l, ok := vm.CPU.HypervList(); ok && len(l) == 0 {
		vm.CPU.Hyperv = nil // false and [] are unset: one spelling, no change
	}
}
