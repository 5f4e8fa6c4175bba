package qemuargs

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// Device is one QEMU device. Its JSON encoding is both the value of
// -device on the command line and the arguments object of QMP device_add, so a
// device plugged at boot and one hot-plugged later cannot differ. Fields that
// a driver does not have are left zero and omitted.
type Device struct {
	Driver        string `json:"driver"`
	ID            string `json:"id"`
	Bus           string `json:"bus,omitempty"`
	Addr          string `json:"addr,omitempty"` // "0x2" or "0x2.0x1" (slot.function)
	Multifunction bool   `json:"multifunction,omitempty"`

	// pcie-root-port
	Chassis int `json:"chassis,omitempty"`
	Port    int `json:"port,omitempty"`

	// virtio-blk-pci
	Drive      string `json:"drive,omitempty"` // node-name of the format node
	Serial     string `json:"serial,omitempty"`
	BootIndex  int    `json:"bootindex,omitempty"`
	WriteCache string `json:"write-cache,omitempty"` // "on" or "off"
	ShareRW    *bool  `json:"share-rw,omitempty"`
	IOThread   string `json:"iothread,omitempty"` // id of an iothread object
	// IOThreadVQMapping spreads virtio-blk's queues over iothread objects
	// (QEMU 9 and newer; hostcaps refuses it on older ones).
	IOThreadVQMapping []VQMapping `json:"iothread-vq-mapping,omitempty"`
	// virtio-blk-pci and virtio-scsi-pci tuning (spec tuning.go); zero
	// or nil: QEMU's default.
	NumQueues     int   `json:"num-queues,omitempty"` // virtio-blk-pci
	SCSINumQueues int   `json:"num_queues,omitempty"` // virtio-scsi-pci
	EventIdx      *bool `json:"event_idx,omitempty"`

	// virtio-net-pci
	Netdev      string  `json:"netdev,omitempty"`
	MAC         string  `json:"mac,omitempty"`
	ROMFile     *string `json:"romfile,omitempty"`  // "" disables the option ROM (no iPXE)
	HostMTU     int     `json:"host_mtu,omitempty"` // MTU the guest driver is told to use
	MQ          *bool   `json:"mq,omitempty"`       // multiqueue (netdev queues > 1)
	Vectors     int     `json:"vectors,omitempty"`  // MSI-X vectors: 2*queues+2 with mq
	RxQueueSize int     `json:"rx_queue_size,omitempty"`
	TxQueueSize int     `json:"tx_queue_size,omitempty"` // QEMU takes at most 256 with a tap backend

	// virtserialport
	Chardev string `json:"chardev,omitempty"`
	Name    string `json:"name,omitempty"`

	GuestCID uint32 `json:"guest-cid,omitempty"` // vhost-vsock-pci: the guest's vsock context id
	// vfio-pci: the host PCI address ("0000:01:00.0") and whether the
	// device's option ROM is mapped (0 off, 1 on; nil QEMU's default, on).
	Host   string `json:"host,omitempty"`
	ROMBar *int   `json:"rombar,omitempty"`

	RNG string `json:"rng,omitempty"` // virtio-rng-pci: id of its rng-random object
	// virtio-rng-pci's rate limit: at most MaxBytes every Period ms.
	MaxBytes int64  `json:"max-bytes,omitempty"`
	Period   int64  `json:"period,omitempty"`
	GUID     string `json:"guid,omitempty"` // vmgenid: the generation id

	TPMDev   string `json:"tpmdev,omitempty"`    // tpm-crb, tpm-tis: the -tpmdev id
	FSDev    string `json:"fsdev,omitempty"`     // virtio-9p-pci: the -fsdev id
	MountTag string `json:"mount_tag,omitempty"` // virtio-9p-pci: the guest's mount tag
	// vhost-user-fs-pci (and its Chardev): the guest's mount tag, the
	// request queue's size (virtio-blk-pci's queue-size too).
	Tag       string `json:"tag,omitempty"`
	QueueSize int    `json:"queue-size,omitempty"`
}

// Args renders the device for the command line: -device JSON.
func (d Device) Args() ([]string, error) {
	j, err := marshalJSON(d)
	if err != nil {
		return nil, fmt.Errorf("device %q: %w", d.ID, err)
	}
	return []string{"-device", j}, nil
}

// Root buses and the PCI layout.
const (
	PCIeRootBus = "pcie.0" // q35
	PCIRootBus  = "pci.0"  // pc

	q35FirstPortSlot = 0x2  // 0x0 is the host bridge, 0x1 the guest agent
	q35LastPortSlot  = 0x1e // 0x1f is the ICH9 LPC/SMBus/SATA function group
	q35AgentSlot     = 0x1
	pcAgentSlot      = 0x2 // 0x0 host bridge, 0x1 PIIX3
	pcFirstSlot      = 0x3
	pcLastSlot       = 0x1f
	portsPerSlot     = 8
)

// MaxPCSlots is how many devices fit on pci.0 of the pc machine (slots
// 0x3..0x1f).
const MaxPCSlots = pcLastSlot - pcFirstSlot + 1

// MaxRootPorts is how many pcie-root-ports fit on pcie.0 in the layout used
// here (slots 0x2..0x1e, 8 functions each).
const MaxRootPorts = (q35LastPortSlot - q35FirstPortSlot + 1) * portsPerSlot

func pciAddr(slot, fn int) string {
	if fn == 0 {
		return fmt.Sprintf("0x%x", slot)
	}
	return fmt.Sprintf("0x%x.0x%x", slot, fn)
}

// placement is where a disk, NIC or vsock device goes.
type placement struct{ bus, addr string }

// pciLayout places the VM's devices. On q35 every NIC, disk and host
// device gets its own root port (NICs first, in order, then disks, then
// host devices, then the vsock device, then the spare ports), so each can be
// unplugged like a hot-plugged one; NICs come first, as in libvirt, so that
// adding a disk does not move a NIC to another bus (and rename it in the
// guest), and host devices come after the disks so that passing one through
// moves neither (the vsock device has no guest name to lose). On pc the
// devices sit on pci.0 at consecutive slots, same order.
type pciLayout struct {
	rootPorts []Device
	nics      []placement
	disks     []placement
	hostdevs  []placement
	vsock     placement // empty without a vsock device
	spare     []string  // ids of the empty root ports
	agent     placement
}

func layout(vm *spec.VM) (pciLayout, error) {
	l := pciLayout{disks: make([]placement, len(vm.Disks))}
	l.sata(vm)
	pd := placedDevices(vm)
	n := pd.n
	field, counts := pd.field, pd.counts()
	place := func(i int, p placement) { pd.place(&l, i, p) }
	switch spec.MachineFamily(vm.Machine) {
	case spec.MachineQ35:
		if vm.Slots() < 0 {
			return l, errorf("hotplug_slots", "%d is negative", vm.Slots())
		}
		total, max := n+vm.Slots(), MaxRootPorts
		if hasDisplaySlot(vm) {
			max -= portsPerSlot // the display's slot
		}
		if total > max {
			return l, errorf(field(max), "needs root port %d of at most %d (%s + %d hotplug slots)",
				max+1, max, counts, vm.Slots())
		}
		for i := 0; i < total; i++ {
			slot, fn := q35FirstPortSlot+i/portsPerSlot, i%portsPerSlot
			id := RootPortID(i + 1)
			l.rootPorts = append(l.rootPorts, Device{
				Driver: "pcie-root-port", ID: id, Bus: PCIeRootBus, Addr: pciAddr(slot, fn),
				Multifunction: fn == 0 && i+1 < total, // function 1 follows in this slot
				Chassis:       i + 1, Port: slot<<3 | fn,
			})
			if i < n {
				place(i, placement{bus: id})
			} else {
				l.spare = append(l.spare, id)
			}
		}
		l.agent = placement{PCIeRootBus, pciAddr(q35AgentSlot, 0)}
	case spec.MachinePC:
		if vm.Slots() != 0 {
			return l, errorf("hotplug_slots", "root ports exist only on q35; machine pc hotplugs onto %s", PCIRootBus)
		}
		max := MaxPCSlots
		if hasDisplaySlot(vm) {
			max-- // the display's slot
		}
		if n > max {
			return l, errorf(field(max), "no free slot on %s: %s, at most %d devices", PCIRootBus, counts, max)
		}
		for i := 0; i < n; i++ {
			place(i, placement{PCIRootBus, pciAddr(pcFirstSlot+i, 0)})
		}
		l.agent = placement{PCIRootBus, pciAddr(pcAgentSlot, 0)}
	default:
		return l, errorf("machine", "unknown machine %q (want \"q35\", \"pc\", or pc-q35-X.Y / pc-i440fx-X.Y)", vm.Machine)
	}
	for i, d := range vm.Disks {
		if d.Bus == spec.BusSATA && !vm.Q35() {
			return l, errorf(fmt.Sprintf("disk[%d].bus", i), "\"sata\" needs machine \"q35\" (its AHCI controller)")
		}
		if d.Bus == spec.BusSATA && l.disks[i].bus == "" {
			return l, errorf(fmt.Sprintf("disk[%d].bus", i), "more than %d SATA disks", spec.MaxSATADisks)
		}
	}
	return l, nil
}

// placed are the devices that take a root port (q35) or a slot (pc), in
// order: NICs, the disks on PCI (all but SATA ones), host devices, the
// vsock device.
type placed struct {
	vm       *spec.VM
	pciDisks []int // indexes of the disks on PCI
	nd, nh   int   // ends of the disks and of the host devices
	n        int   // all of them
}

func placedDevices(vm *spec.VM) placed {
	p := placed{vm: vm}
	for i, d := range vm.Disks {
		if d.Bus != spec.BusSATA {
			p.pciDisks = append(p.pciDisks, i)
		}
	}
	p.nd = len(vm.NICs) + len(p.pciDisks)
	p.nh = p.nd + len(vm.HostDevs)
	p.n = p.nh
	if vm.Vsock.On() {
		p.n++
	}
	return p
}

// field is the spec field of the i-th placed device.
func (p placed) field(i int) string {
	switch {
	case i < len(p.vm.NICs):
		return fmt.Sprintf("nic[%d]", i)
	case i < p.nd:
		return fmt.Sprintf("disk[%d]", p.pciDisks[i-len(p.vm.NICs)])
	case i < p.nh:
		return fmt.Sprintf("hostdev[%d]", i-p.nd)
	case i < p.n:
		return "vsock"
	}
	return "hotplug_slots"
}

// counts says what is placed, for errors.
func (p placed) counts() string {
	c := fmt.Sprintf("%d NICs + %d disks", len(p.vm.NICs), len(p.vm.Disks))
	if len(p.vm.HostDevs) > 0 {
		c += fmt.Sprintf(" + %d host devices", len(p.vm.HostDevs))
	}
	if p.n > p.nh {
		c += " + vsock"
	}
	return c
}

// place puts the i-th device at at.
func (p placed) place(l *pciLayout, i int, at placement) {
	switch {
	case i < len(p.vm.NICs):
		l.nics = append(l.nics, at)
	case i < p.nd:
		l.disks[p.pciDisks[i-len(p.vm.NICs)]] = at
	case i < p.nh:
		l.hostdevs = append(l.hostdevs, at)
	default:
		l.vsock = at
	}
}

// sata places the SATA disks on the ports of q35's AHCI controller
// ("ide.0".."ide.5", QEMU's names), in disk order; a disk past the last
// port keeps no bus (layout reports it).
func (l *pciLayout) sata(vm *spec.VM) {
	port := 0
	for i, d := range vm.Disks {
		if d.Bus == spec.BusSATA && port < spec.MaxSATADisks {
			l.disks[i] = placement{bus: SATAPort(port)}
			port++
		}
	}
}

// SpareRootPorts returns the ids of the root ports Build leaves empty for
// hotplug, in order; nil for the pc machine (hotplug onto pci.0) or an
// invalid layout.
func SpareRootPorts(vm *spec.VM) []string {
	l, err := layout(vm)
	if err != nil {
		return nil
	}
	return l.spare
}

// slotDevices are the devices of the fixed slot on the root bus: the
// guest agent's virtio-serial controller (and its port named
// org.qemu.guest_agent.0 on the agent chardev), the balloon, the watchdog
// and the RNG, on functions 0, 1, 2, 3 in that order as present, so that
// adding one moves no disk or NIC.
func slotDevices(p placement, vm *spec.VM) []Device {
	var out, fns []Device
	if vm.HasGuestAgent() {
		fns = append(fns, Device{Driver: "virtio-serial-pci", ID: AgentSerialDeviceID})
	}
	if vm.Balloon {
		fns = append(fns, Device{Driver: "virtio-balloon-pci", ID: BalloonDeviceID})
	}
	if vm.Watchdog != "" && vm.WatchdogModel == spec.WatchdogI6300ESB {
		fns = append(fns, Device{Driver: "i6300esb", ID: WatchdogDeviceID})
	}
	if vm.HasRNG() {
		rng := Device{Driver: "virtio-rng-pci", ID: RNGDeviceID, RNG: RNGObjectID}
		if r := vm.RNGRate; r.Limited() {
			rng.MaxBytes, rng.Period = r.Bytes, r.EffectivePeriod().D().Milliseconds()
		}
		fns = append(fns, rng)
	}
	fns = append(fns, shareDevices(vm)...)
	for fn, d := range fns {
		d.Bus, d.Addr, d.Multifunction = p.bus, p.addr, fn == 0 && len(fns) > 1
		if fn > 0 {
			d.Addr += fmt.Sprintf(".0x%x", fn)
		}
		out = append(out, d)
		if d.ID == AgentSerialDeviceID {
			out = append(out, Device{Driver: "virtserialport", ID: AgentPortDeviceID, Bus: AgentSerialDeviceID + ".0",
				Chardev: AgentChardevID, Name: AgentPortName})
		}
	}
	return out
}

// panicActions are QEMU's -action values for the spec's failure keys: a
// panic that ends QEMU (poweroff, restart: the unit's stop-post hook
// decides about a restart) or pauses the guest (pause, preserve).
func panicActions(vm *spec.VM) []string {
	var out []string
	switch vm.OnPanic {
	case spec.PanicPoweroff, spec.PanicRestart:
		out = append(out, "panic=shutdown")
	case spec.PanicPause, spec.PanicPreserve:
		out = append(out, "panic=pause")
	}
	if vm.Watchdog != "" {
		out = append(out, "watchdog="+vm.Watchdog)
	}
	return out
}

// VQMapping is one entry of virtio-blk's iothread-vq-mapping: an iothread
// object's id and the virtqueues it serves (none: round-robin).
type VQMapping struct {
	IOThread string `json:"iothread"`
	VQs      []int  `json:"vqs,omitempty"`
}
