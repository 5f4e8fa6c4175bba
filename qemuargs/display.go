package qemuargs

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// The graphical console ([display]): a video device and a USB tablet on a
// slot of their own on the root bus (the last one the layout would give a
// root port or a device, so adding or removing a display moves no disk or
// NIC), the VNC server on a unix socket; and the Windows-facing machine
// options: the RTC's base and the Hyper-V enlightenments.

// IDs of the display's devices.
const (
	VideoDeviceID  = "video0"
	USBDeviceID    = "usb0" // the tablet's qemu-xhci controller
	TabletDeviceID = "tablet0"
)

// Slots of the display's devices: q35's last root-port slot, pc's last slot.
const (
	q35DisplaySlot = q35LastPortSlot
	pcDisplaySlot  = pcLastSlot
)

// VideoDriver is QEMU's device for a spec video value ("" for none).
func VideoDriver(video string) string {
	switch video {
	case spec.VideoStd:
		return "VGA"
	case spec.VideoVirtio:
		return "virtio-vga"
	case spec.VideoBochs:
		return "bochs-display"
	case spec.VideoQXL:
		return "qxl-vga"
	}
	return ""
}

// hasDisplaySlot reports whether the VM's display devices take a slot.
func hasDisplaySlot(vm *spec.VM) bool {
	return vm.Display.HasVideo() || vm.Display.HasTablet()
}

// displayDevices are the video device (function 0) and the tablet's
// controller (the next function) and the tablet itself, at the display
// slot of the machine.
func displayDevices(vm *spec.VM) ([]Device, error) {
	d := vm.Display
	if !hasDisplaySlot(vm) {
		return nil, nil
	}
	var fns []Device
	if d.HasVideo() {
		drv := VideoDriver(d.Video)
		if drv == "" {
			return nil, errorf("display.video", "unknown video device %q", d.Video)
		}
		fns = append(fns, Device{Driver: drv, ID: VideoDeviceID})
	}
	if d.HasTablet() {
		fns = append(fns, Device{Driver: "qemu-xhci", ID: USBDeviceID})
	}
	bus, slot := PCIeRootBus, q35DisplaySlot
	if !vm.Q35() {
		bus, slot = PCIRootBus, pcDisplaySlot
	}
	var out []Device
	for fn, dev := range fns {
		dev.Bus, dev.Addr, dev.Multifunction = bus, pciAddr(slot, fn), fn == 0 && len(fns) > 1
		out = append(out, dev)
	}
	if d.HasTablet() {
		out = append(out, Device{Driver: "usb-tablet", ID: TabletDeviceID, Bus: USBDeviceID + ".0"})
	}
	return out, nil
}

// vncServer is -vnc on a unix socket, asking for a password when set
// (there is none until QMP set_password gives one).
type vncServer struct {
	Path     string
	Password bool
}

func (v vncServer) Args() ([]string, error) {
	p, err := escapeValue(v.Path)
	if err != nil {
		return nil, fmt.Errorf("vnc socket: %w", err)
	}
	a := "unix:" + p
	if v.Password {
		a += ",password=on"
	}
	return []string{"-vnc", a}, nil
}

// displayParts: the display's devices and VNC server, the RTC's base.
func displayParts(vm *spec.VM, o Options) ([]renderer, error) {
	var parts []renderer
	devs, err := displayDevices(vm)
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		parts = append(parts, d)
	}
	if vm.Display.HasVNC() {
		parts = append(parts, vncServer{o.VNCSocket, vm.Display.Password})
	}
	if vm.RTC == spec.RTCLocalTime {
		parts = append(parts, flags{"-rtc", "base=localtime"})
	}
	return parts, nil
}

// hypervProps are the -cpu properties of the VM's enlightenments under
// accel; none under TCG, which has none (QEMU refuses hv-vpindex there).
func hypervProps(vm *spec.VM, accel spec.Accel) ([]string, error) {
	list, ok := vm.CPU.HypervList()
	if !ok {
		return nil, errorf("cpu.hyperv", "want true, false or a list of enlightenments")
	}
	if accel != spec.AccelKVM {
		return nil, nil
	}
	var props []string
	for _, h := range list {
		if err := spec.ValidCPUModel(h); err != nil {
			return nil, errorf("cpu.hyperv", "invalid enlightenment %q", h)
		}
		if h == "spinlocks" {
			props = append(props, fmt.Sprintf("hv-spinlocks=%#x", spec.HypervSpinlocks))
			continue
		}
		props = append(props, "hv-"+h+"=on")
	}
	return props, nil
}
