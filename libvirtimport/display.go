package libvirtimport

import (
	"fmt"
	"slices"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// The graphical console and Windows' settings: <graphics>, <video> and
// <input type='tablet'> become [display]; <features><hyperv> becomes
// [cpu] hyperv; <clock offset='localtime'> becomes rtc.

// displayKnownText are the paths display.go reads (known.go's syntax).
const displayKnownText = `
devices/graphics @type @port @autoport @listen @passwd @websocket @socket
devices/graphics/listen @type @address @socket
devices/video
devices/video/model @type @primary @heads @ram @vram @vram64 @vgamem
devices/input @type @bus
features/hyperv @mode
features/hyperv/relaxed @state
features/hyperv/vapic @state
features/hyperv/spinlocks @state @retries
features/hyperv/vpindex @state
features/hyperv/runtime @state
features/hyperv/synic @state
features/hyperv/stimer @state
features/hyperv/stimer/direct @state
features/hyperv/reset @state
features/hyperv/vendor_id @state @value
features/hyperv/frequencies @state
features/hyperv/reenlightenment @state
features/hyperv/tlbflush @state
features/hyperv/tlbflush/direct @state
features/hyperv/tlbflush/extended @state
features/hyperv/ipi @state
features/hyperv/evmcs @state
features/hyperv/avic @state
features/hyperv/emsr_bitmap @state
features/hyperv/xmm_input @state
clock/timer @name @present
`

type fileDisplay struct {
	Video    string `toml:"video,omitempty"`
	VNC      *bool  `toml:"vnc,omitempty"`
	Tablet   *bool  `toml:"tablet,omitempty"`
	Password bool   `toml:"password,omitempty"`
}

type fileCPU struct {
	Hyperv []string `toml:"hyperv,omitempty"`
}

// videoModels maps libvirt's video models to vmsup's video values.
var videoModels = map[string]string{
	"vga": spec.VideoStd, "cirrus": spec.VideoStd, "virtio": spec.VideoVirtio, "bochs": spec.VideoBochs,
	"qxl": spec.VideoQXL, "none": spec.VideoNone,
}

// display maps the domain's graphics, video and input devices.
func (c *converter) display(dv *libvirtxml.DomainDeviceList) {
	if len(dv.Graphics) == 0 && len(dv.Videos) == 0 {
		for i, in := range dv.Inputs {
			if in.Bus != "ps2" { // QEMU's own PS/2 keyboard and mouse, which every pc and q35 has
				c.drop(fmt.Sprintf("devices/input[%d]", i), "%s on %s: vmsup adds a tablet only with a [display]", in.Type, in.Bus)
			}
		}
		return
	}
	d := &fileDisplay{}
	no := false
	d.VNC, d.Tablet = &no, &no
	c.graphics(d, dv.Graphics)
	for i, v := range dv.Videos {
		el := fmt.Sprintf("devices/video[%d]", i)
		switch video, ok := videoModels[v.Model.Type]; {
		case i > 0:
			c.drop(el, "model %q: vmsup gives a VM one video device", v.Model.Type)
		case !ok:
			d.Video = spec.VideoStd
			c.drop(el, "model %q: vmsup's video devices are std, virtio, bochs, qxl; std it is", v.Model.Type)
		default:
			d.Video = video
			if v.Model.Type == "cirrus" {
				c.drop(el, "model \"cirrus\": std (QEMU's VGA) it is")
			}
		}
		if m := v.Model; i == 0 && (m.Ram != 0 || m.VRam != 0 || m.VRam64 != 0 || m.VGAMem != 0 || m.Heads > 1) {
			c.drop(el+"/model", "memory sizes and heads: QEMU's defaults for the device apply (one head)")
		}
	}
	if len(dv.Videos) == 0 {
		d.Video = spec.VideoNone // graphics without a video device: a screen with nothing on it
	}
	if d.Video == spec.VideoStd {
		d.Video = "" // vmsup's default
	}
	for i, in := range dv.Inputs {
		switch {
		case in.Type == "tablet" && (in.Bus == "usb" || in.Bus == ""):
			d.Tablet = nil // vmsup's default: on
		case in.Bus == "ps2":
			// QEMU's own PS/2 keyboard and mouse, which every pc and q35 has.
		default:
			c.drop(fmt.Sprintf("devices/input[%d]", i), "%s on %s: vmsup's only input device is the USB tablet", in.Type, in.Bus)
		}
	}
	c.out.Display = d
}

// graphics: VNC (and SPICE, whose clients vmsup does not serve) become
// vmsup's VNC server on its unix socket.
func (c *converter) graphics(d *fileDisplay, gs []libvirtxml.DomainGraphic) {
	for i, g := range gs {
		el := fmt.Sprintf("devices/graphics[%d]", i)
		switch {
		case g.VNC != nil && d.VNC == nil:
			c.drop(el+" (vnc)", "a second VNC server: vmsup's VM has one")
		case g.VNC != nil:
			d.VNC = nil // vmsup's default: on
			if g.VNC.Passwd != "" {
				d.Password = true
				c.drop(el+"/@passwd", "not kept: vmsup sets a one-time VNC password for each session (password = true)")
			}
			if g.VNC.Port > 0 || g.VNC.Listen != "" || len(g.VNC.Listeners) > 0 || g.VNC.WebSocket != 0 {
				c.drop(el+" (vnc)", "listen address and ports: vmsup's VNC server is a unix socket in the state directory (vmsup vnc, vmsup console --web)")
			}
		case g.Spice != nil && d.VNC != nil:
			d.VNC = nil
			c.drop(el+" (spice)", "vmsup serves the screen over VNC (vmsup vnc, vmsup console --web), not SPICE")
		default:
			c.drop(el, "only VNC (or SPICE, served as VNC) maps to vmsup's [display]")
		}
	}
}

// hyperv maps <features><hyperv>: each enlightenment turned on that QEMU
// 7.2 has.
func (c *converter) hyperv(h *libvirtxml.DomainFeatureHyperV) {
	if h == nil {
		return
	}
	on := func(s *libvirtxml.DomainFeatureState) bool { return s != nil && s.State == "on" }
	var list []string
	add := func(name string, s *libvirtxml.DomainFeatureState) {
		if on(s) {
			list = append(list, name)
		}
	}
	add("relaxed", h.Relaxed)
	add("vapic", h.VAPIC)
	if h.Spinlocks != nil {
		add("spinlocks", &h.Spinlocks.DomainFeatureState)
		if on(&h.Spinlocks.DomainFeatureState) && h.Spinlocks.Retries != 0 && h.Spinlocks.Retries != spec.HypervSpinlocks {
			c.drop("features/hyperv/spinlocks/@retries", "%d: vmsup's spinlock retries are %#x", h.Spinlocks.Retries, spec.HypervSpinlocks)
		}
	}
	add("vpindex", h.VPIndex)
	add("runtime", h.Runtime)
	add("synic", h.Synic)
	if h.STimer != nil {
		add("stimer", &h.STimer.DomainFeatureState)
		add("stimer-direct", h.STimer.Direct)
	}
	add("frequencies", h.Frequencies)
	add("reset", h.Reset)
	add("reenlightenment", h.ReEnlightenment)
	if h.TLBFlush != nil {
		add("tlbflush", &h.TLBFlush.DomainFeatureState)
		add("tlbflush-direct", h.TLBFlush.Direct)
		add("tlbflush-ext", h.TLBFlush.Extended)
	}
	add("ipi", h.IPI)
	add("avic", h.AVIC)
	add("emsr-bitmap", h.EMSRBitmap)
	add("xmm-input", h.XMMInput)
	if on(h.EVMCS) {
		c.drop("features/hyperv/evmcs", "enlightened VMCS (nested guests on Intel) is not in vmsup's list")
	}
	if h.VendorId != nil && h.VendorId.State == "on" {
		c.drop("features/hyperv/vendor_id", "%q: QEMU's Hyper-V vendor id applies", h.VendorId.Value)
	}
	if h.Mode == "passthrough" {
		c.drop("features/hyperv/@mode", "passthrough: vmsup names the enlightenments ([cpu] hyperv)")
	}
	if len(list) > 0 {
		c.out.CPU = &fileCPU{Hyperv: list}
	}
}

// clock maps <clock>: offset localtime is rtc = "localtime", the
// hypervclock timer the "time" enlightenment (libvirt keeps it there);
// QEMU's default clock otherwise.
func (c *converter) clock(cl *libvirtxml.DomainClock) {
	if cl == nil {
		return
	}
	var timers []libvirtxml.DomainTimer
	for _, t := range cl.Timer {
		if t.Name == "hypervclock" && t.Present == "yes" {
			if c.out.CPU == nil {
				c.out.CPU = &fileCPU{}
			}
			c.out.CPU.Hyperv = append(c.out.CPU.Hyperv, "time")
			slices.SortStableFunc(c.out.CPU.Hyperv, func(a, b string) int {
				return slices.Index(spec.HypervFeatures, a) - slices.Index(spec.HypervFeatures, b)
			})
			continue
		}
		timers = append(timers, t)
	}
	switch {
	case cl.Offset == "localtime":
		c.out.RTC = spec.RTCLocalTime
		if len(timers) > 0 {
			c.drop("clock/timer", "%d timer settings: QEMU's defaults apply", len(timers))
		}
	case cl.Offset != "" && cl.Offset != "utc" || len(timers) > 0:
		c.drop("clock", "offset %q with %d timer settings: vmsup guests run QEMU's default clock (UTC)", cl.Offset, len(timers))
	}
}
