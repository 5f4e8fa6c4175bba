package libvirtimport

import (
	"fmt"
	"net"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// devices maps the domain's devices; disks and NICs are in disks.go and
// nics.go. An error is a domain with more devices than vmsup lays out.
func (c *converter) devices() error {
	dv := c.dom.Devices
	if dv == nil {
		dv = &libvirtxml.DomainDeviceList{}
	}
	c.disks(dv.Disks)
	c.bootOrder()
	c.nics(dv.Interfaces)
	c.platform(dv)
	c.hostdevs(dv.Hostdevs)
	c.guestDevs(dv)
	c.unsupported(dv)
	c.platformDefaults()
	return c.fitLayout()
}

// platform: the devices vmsup has keys for.
func (c *converter) platform(dv *libvirtxml.DomainDeviceList) {
	off := false
	agent := false
	for i, ch := range dv.Channels {
		if ch.Target != nil && ch.Target.VirtIO != nil && ch.Target.VirtIO.Name == "org.qemu.guest_agent.0" {
			agent = true
			continue
		}
		c.drop(fmt.Sprintf("devices/channel[%d]", i), "only the guest agent's channel maps to vmsup (guest_agent)")
	}
	if !agent {
		c.out.GuestAgent = &off
	}
	rng := false
	for i, r := range dv.RNGs {
		if r.Model != "virtio" || rng {
			c.drop(fmt.Sprintf("devices/rng[%d]", i), "vmsup has one virtio-rng")
			continue
		}
		rng = true
		if b := r.Backend; b != nil && (b.Random == nil || b.Random.Device != "/dev/urandom") {
			c.drop(fmt.Sprintf("devices/rng[%d]/backend", i), "vmsup's RNG reads the host's /dev/urandom")
		}
		c.rngRate(i, r.Rate)
	}
	if !rng {
		c.out.RNG = &off
	}
	if b := dv.MemBalloon; b != nil && b.Model == "virtio" {
		c.out.Balloon = true
	}
	if !c.out.Balloon {
		c.out.BalloonTarget = ""
	}
	c.watchdogs(dv.Watchdogs)
	c.panics(dv.Panics)
	for i, con := range dv.Consoles {
		if t := con.Target; t != nil && t.Type != "" && t.Type != "serial" {
			c.drop(fmt.Sprintf("devices/console[%d]", i), "a %s console: vmsup's console is its first serial port (vmsup console)", t.Type)
		}
	}
	for i, s := range dv.Serials {
		if s.Source != nil && s.Source.Pty == nil {
			c.drop(fmt.Sprintf("devices/serial[%d]", i), "a serial port that is not a pty: vmsup's console is its first serial port (vmsup console)")
		}
	}
}

func (c *converter) watchdogs(ws []libvirtxml.DomainWatchdog) {
	for i, w := range ws {
		model, known := map[string]string{"i6300esb": "", "itco": spec.WatchdogITCO, "ib700": spec.WatchdogIB700}[w.Model]
		switch {
		case !known:
			c.drop(fmt.Sprintf("devices/watchdog[%d]", i), "model %q, action %q: not carried over, vmsup has no such watchdog (i6300esb, itco or ib700: watchdog_model)", w.Model, cmpOr(w.Action, "reset"))
			continue
		case c.out.Watchdog != "":
			c.drop(fmt.Sprintf("devices/watchdog[%d]", i), "model %q, action %q: not carried over, vmsup's guest has one watchdog (the first)", w.Model, cmpOr(w.Action, "reset"))
			continue
		}
		c.out.WatchdogModel = model
		c.out.Watchdog = map[string]string{"": "reset", "reset": "reset", "shutdown": "shutdown", "poweroff": "poweroff",
			"pause": "pause", "none": "none", "dump": "pause", "inject-nmi": "inject-nmi"}[w.Action]
		if c.out.Watchdog == "" || w.Action == "dump" {
			c.out.Watchdog = "reset"
			c.drop(fmt.Sprintf("devices/watchdog[%d]/@action", i), "%q: vmsup does not dump the guest's memory; its watchdog resets the guest", w.Action)
		}
	}
}

func (c *converter) panics(ps []libvirtxml.DomainPanic) {
	for i, p := range ps {
		if (p.Model != "" && p.Model != "isa") || c.out.OnPanic != "" {
			c.drop(fmt.Sprintf("devices/panic[%d]", i), "model %q: vmsup's panic device is the ISA pvpanic", p.Model)
			continue
		}
		c.out.OnPanic = map[string]string{"": spec.PanicPoweroff, "destroy": spec.PanicPoweroff, "restart": spec.PanicRestart,
			"preserve": spec.PanicPreserve, "coredump-destroy": spec.PanicPoweroff, "coredump-restart": spec.PanicRestart}[c.dom.OnCrash]
		if strings.HasPrefix(c.dom.OnCrash, "coredump-") {
			c.drop("on_crash", "%q: vmsup does not dump the guest's memory on a panic", c.dom.OnCrash)
		}
	}
	if len(ps) == 0 && c.dom.OnCrash != "" && c.dom.OnCrash != "destroy" {
		c.drop("on_crash", "%q acts on a guest panic, which needs a panic device (none here)", c.dom.OnCrash)
	}
}

// hostQEMU is the QEMU vmsup runs (Debian's, libvirt's usual emulator).
const hostQEMU = "/usr/bin/qemu-system-x86_64"

// unsupported lists the devices vmsup has no counterpart for, one line
// each, with why.
func (c *converter) unsupported(dv *libvirtxml.DomainDeviceList) {
	list := func(el string, n int, why string) {
		for i := 0; i < n; i++ {
			c.drop(fmt.Sprintf("devices/%s[%d]", el, i), "%s", why)
		}
	}
	if dv.Emulator != "" && dv.Emulator != hostQEMU {
		c.note("devices/emulator", "%s: vmsup runs the host's %s", dv.Emulator, hostQEMU)
	}
	c.display(dv)
	list("sound", len(dv.Sounds), "vmsup VMs have no sound device")
	list("audio", len(dv.Audios), "vmsup VMs have no sound device")
	list("redirdev", len(dv.RedirDevs), "USB redirection needs a display client")
	list("smartcard", len(dv.Smartcards), "no smartcard passthrough in vmsup")
	list("hub", len(dv.Hubs), "no USB devices in vmsup")
	list("parallel", len(dv.Parallels), "no parallel port in vmsup")
	list("shmem", len(dv.Shmems), "no shared memory devices in vmsup")
	list("crypto", len(dv.Crypto), "no virtio-crypto in vmsup")
	list("iommu", len(dv.IOMMUs), "no vIOMMU in vmsup")
	list("lease", len(dv.Leases), "vmsup holds image locks through QEMU itself")
	if dv.NVRAM != nil {
		c.drop("devices/nvram", "no NVRAM device in vmsup")
	}
	if dv.PStore != nil {
		c.drop("devices/pstore", "no pstore device in vmsup")
	}
	c.controllers(dv.Controllers)
}

// controllers: vmsup lays out its own PCI(e) buses, SATA, USB and
// virtio-serial controllers; a SCSI controller's model is what the guest
// sees (libvirt's default is lsi), and each vmsup SCSI disk has a
// virtio-scsi controller of its own.
func (c *converter) controllers(ctls []libvirtxml.DomainController) {
	for i, ctl := range ctls {
		el := fmt.Sprintf("devices/controller[%d]", i)
		switch {
		case ctl.Type == "scsi" && ctl.Model != "virtio-scsi":
			model := ctl.Model
			if model == "" {
				model = "lsi" // libvirt's default on x86
			}
			c.drop(el+"/@model", "SCSI model %q: vmsup's SCSI disks are on virtio-scsi (the guest needs its virtio_scsi driver)", model)
		case ctl.Type == "fdc" || ctl.Type == "ccid" || ctl.Type == "xenbus" || ctl.Type == "nvme":
			c.drop(el, "%s controller: none in vmsup", ctl.Type)
		}
		if ctl.Driver != nil {
			c.drop(el+"/driver", "a controller's queues and I/O thread: each vmsup SCSI disk has a controller of its own; set them on the disks (queues, iothread_id)")
		}
	}
	if n := c.scsiDisks(); n > 1 {
		c.note("devices/controller", "%d SCSI disks share libvirt's controllers; in vmsup each has a virtio-scsi controller of its own (the guest sees %d SCSI hosts)", n, n)
	}
}

// scsiDisks counts the carried disks on SCSI (CD-ROMs and LUNs included).
func (c *converter) scsiDisks() int {
	n := 0
	for _, d := range c.out.Disks {
		if d.Bus == spec.BusSCSI || (d.Bus == "" && (d.Device == spec.DeviceCDROM || d.Device == spec.DeviceLUN || d.Type == spec.DiskISO)) {
			n++
		}
	}
	return n
}

// hostPort joins a libvirt host element into HOST:PORT.
func hostPort(h libvirtxml.DomainDiskSourceHost, defPort string) string {
	port := h.Port
	if port == "" {
		port = defPort
	}
	return net.JoinHostPort(strings.Trim(h.Name, "[]"), port)
}

// hostdevs maps PCI host devices passed through with VFIO to [[hostdev]];
// USB, SCSI and mediated devices have no counterpart.
func (c *converter) hostdevs(hs []libvirtxml.DomainHostdev) {
	for i, h := range hs {
		el := fmt.Sprintf("devices/hostdev[%d]", i)
		p := h.SubsysPCI
		if p == nil {
			c.drop(el, "only PCI devices pass through in vmsup (VFIO)")
			continue
		}
		if p.Driver != nil && p.Driver.Name != "" && p.Driver.Name != "vfio" {
			c.drop(el, "driver %q: vmsup passes PCI devices through with VFIO only", p.Driver.Name)
			continue
		}
		var a *libvirtxml.DomainAddressPCI
		if p.Source != nil {
			a = p.Source.Address
		}
		if a == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
			c.drop(el, "no PCI source address")
			continue
		}
		var dom uint
		if a.Domain != nil {
			dom = *a.Domain
		}
		out := fileHostDev{Address: fmt.Sprintf("%04x:%02x:%02x.%x", dom, *a.Bus, *a.Slot, *a.Function), el: el}
		if r := h.ROM; r != nil {
			if r.Bar == "off" {
				off := false
				out.ROMBar = &off
			}
			if r.File != nil || r.Enabled != "" {
				c.drop(el+"/rom", "a ROM file or enabled: vmsup maps the device's own ROM (rom_bar) or none")
			}
		}
		if h.Managed == "no" {
			c.drop(el+"/@managed", "\"no\": vmsup binds the device to vfio-pci itself at up and gives it back at down")
		}
		if h.Boot != nil {
			c.drop(el+"/boot", "host devices have no boot order in vmsup")
		}
		c.out.HostDevs = append(c.out.HostDevs, out)
	}
}
