package qemuargs

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Options are the host facts Build needs, resolved by the caller.
type Options struct {
	Binary string // argv[0], an absolute path, e.g. "/usr/bin/qemu-system-x86_64"; required

	// Accel is the accelerator the caller resolved: spec.AccelKVM or
	// spec.AccelTCG. "auto" and "" are errors: probing KVM is host I/O.
	Accel spec.Accel

	// Unix socket paths (absolute, at most 107 bytes). QEMU listens on all of
	// them and does not wait for a client. AgentSocket is used only if
	// vm.HasGuestAgent().
	QMPSocket, EventSocket, ConsoleSocket, AgentSocket string

	// ConsoleLog, optional, is a file that records the serial console.
	ConsoleLog string

	// EventLog, optional, is the base path of a second QMP monitor that
	// needs no client: a pipe chardev on two regular files the caller
	// makes. QEMU reads EventLog.in (which holds qmp_capabilities, see
	// EventLogInput) and writes the greeting, the reply and then every QMP
	// event to EventLog.out, from its start. Events are thus kept while no
	// vmsup process runs, with no helper process.
	EventLog string

	// FirmwareCode is the OVMF code image for firmware "uefi" or the qboot ROM
	// for "qboot"; required for those, ignored for "bios" (QEMU's SeaBIOS).
	FirmwareCode string
	// FirmwareVars is the VM's own writable copy of the OVMF variable store;
	// required for "uefi", ignored otherwise.
	FirmwareVars string

	// VhostNet says the host has /dev/vhost-net: tap NICs with vhost
	// "auto" use vhost-net. QEMU 7.2 aborts on vhost=on without it, so the
	// caller probes it; false is always safe.
	VhostNet bool
	// Disks holds, by disk name, the host files vmsup prepared for disks
	// that need them (a seed's built ISO, a secret file); see DiskHost.
	Disks map[string]DiskHost

	// CPU is the CPU model the caller chose for the host (from its probe)
	// when the spec names none; "" means host under KVM, max under TCG.
	CPU string
	// CPUFeaturesOff are CPU features turned off on the model
	// ("arch-capabilities"): what the host's KVM needs masked for the
	// model to start (the caller's probe finds them).
	CPUFeaturesOff []string

	// Machine is the machine type the VM runs: its versioned type, pinned
	// at its first start (internal/lifecycle/identity), of the spec's family; ""
	// means the spec's own (an alias QEMU resolves to its newest type).
	Machine string

	// UUID is the VM's UUID when the spec gives none (the caller records
	// the one it generated), GenID its vmgenid generation id (required with
	// vmgenid); "" UUID: QEMU's all-zero default, no -uuid.
	UUID, GenID string
	// Credentials holds, by credential name, the file the caller wrote
	// "io.systemd.credential:NAME=VALUE" into for each of the spec's
	// credentials (readable by QEMU's user).
	Credentials map[string]string

	// TPMSocket is swtpm's control socket (the caller starts swtpm
	// listening there first); required with a [tpm].
	TPMSocket string
	// ShareSockets holds, by tag, the vhost-user socket of each virtiofs
	// share's virtiofsd (the caller starts it listening first).
	ShareSockets map[string]string
	// VsockCID is the guest's vsock context id for a VM with [vsock]: the
	// spec's fixed cid or the one the caller allocated (and holds) for it.
	VsockCID uint32
	// Hugetlbfs is the hugetlbfs mount of the VM's page size (spec
	// hugepages), where QEMU creates the guest's memory: the caller finds
	// it and checks for free pages (host I/O).
	Hugetlbfs string

	// VNCSocket is where the VM's VNC server listens (a unix socket in its
	// state directory); required with [display] and its VNC server.
	VNCSocket string

	// Incoming starts QEMU as a live-migration destination: "-incoming
	// defer" (the supervisor picks the address later with migrate-incoming)
	// and "-S", so the guest stays paused after the stream ends until the
	// supervisor has heard from the source that the migration completed:
	// there is never a moment with two running copies. The console log is
	// opened in append mode so the history already there is kept.
	Incoming bool
	// CPRSocket, with Incoming, makes a cpr-transfer destination (QEMU
	// 10): a second -incoming, the "cpr" channel, on this unix socket.
	// QEMU reads the source's descriptors there (its guest RAM, shared:
	// ShareRAM) before it creates the machine, and answers on its monitors
	// only after that, once the source ran migrate.
	CPRSocket string

	// ShareRAM puts the guest's memory in shared memory that a new QEMU
	// can take over in place (QEMU 10's cpr-transfer, local migration):
	// the -m memory, or each NUMA node's, as memory-backend-memfd
	// share=on, and the machine's other RAM with aux-ram-share=on, which
	// QEMU 10 has and 7.2 lacks. Ignored with hugepages (a private
	// hugetlbfs mapping reserves its pages when QEMU maps it), SEV, and
	// with the spec's shared_memory = false.
	ShareRAM bool
	// RAMID names the -m memory's backend, its RAM block in a migration
	// stream, which both sides must name alike: a destination gets its
	// source's (RAMOf). "" is RAMOf's choice for the spec.
	RAMID string

	// DisksByFD leaves the disks PassedByFD (their files outside
	// StateDir, the VM's state directory) off the command line and starts
	// QEMU paused (-S): the caller plugs them over QMP as descriptors
	// (BootDisks, ChainParts) and then lets the guest run. False renders
	// every disk by path (vmsup argv, a raw QEMU baseline).
	DisksByFD bool
	StateDir  string

	// Taps holds, by NIC name, a tap other than the NIC's own to open: a
	// local migration's new QEMU gets a second tap on the same bridge, as
	// the running QEMU holds the first.
	Taps map[string]string
}

// byFD reports whether Build leaves d off the command line.
func (o Options) byFD(d spec.Disk) bool {
	return o.DisksByFD && PassedByFD(d, o.StateDir)
}

// maxSocketPath is the longest unix socket path (sun_path is 108 bytes with
// its NUL).
const maxSocketPath = 107

// Build renders vm into QEMU's argv (argv[0] is o.Binary). vm must have its
// defaults filled, as spec.Parse does; Build checks every field it renders
// and returns an *Error naming the VM and the field for anything invalid,
// never dropping a device. See the package documentation for the syntax
// rules.
func Build(vm *spec.VM, o Options) ([]string, error) {
	if vm == nil {
		return nil, errors.New("qemuargs: nil VM")
	}
	parts, err := plan(vm, o)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.VM = vm.Name
			return nil, e
		}
		return nil, &Error{VM: vm.Name, Msg: err.Error()}
	}
	argv := []string{o.Binary}
	for _, p := range parts {
		a, err := p.Args()
		if err != nil {
			return nil, &Error{VM: vm.Name, Msg: err.Error()}
		}
		argv = append(argv, a...)
	}
	return argv, nil
}

// plan checks vm and o and lists the parts of the command line in order:
// the machine and its boot, the monitors and console, the fixed devices,
// then NICs and disks on their ports.
func plan(vm *spec.VM, o Options) ([]renderer, error) {
	if err := checkOptions(vm, o); err != nil {
		return nil, err
	}
	if err := checkVM(vm, o.Accel); err != nil {
		return nil, err
	}
	l, err := layout(vm)
	if err != nil {
		return nil, err
	}
	id, idDevices, err := identityParts(vm, o)
	if err != nil {
		return nil, err
	}
	parts, err := machineParts(vm, o)
	if err != nil {
		return nil, err
	}
	parts = append(parts, id)
	parts = append(parts, monitorParts(o)...)
	platform, err := platformParts(vm, o, l, idDevices)
	if err != nil {
		return nil, err
	}
	parts = append(parts, platform...)
	devs, err := deviceParts(vm, o, l)
	if err != nil {
		return nil, err
	}
	parts = append(parts, devs...)
	display, err := displayParts(vm, o)
	if err != nil {
		return nil, err
	}
	parts = append(parts, display...)
	tpm, err := tpmParts(vm, o)
	if err != nil {
		return nil, err
	}
	parts = append(parts, tpm...)
	switch {
	case o.Incoming && o.CPRSocket != "":
		parts = append(parts, flags{"-S", "-incoming", "defer"}, cprIncoming{o.CPRSocket})
	case o.Incoming:
		parts = append(parts, flags{"-S", "-incoming", "defer"})
	case slices.ContainsFunc(vm.Disks, o.byFD):
		parts = append(parts, flags{"-S"}) // until the disks are plugged
	}
	return parts, nil
}

// machineParts: the process flags, the machine, accelerator, CPU, memory,
// vCPUs and NUMA nodes, firmware and boot.
func machineParts(vm *spec.VM, o Options) ([]renderer, error) {
	parts := []renderer{
		flags{"-nodefaults", "-no-user-config", "-display", "none"},
		guestName{vm.Name},
		flags{"-msg", "timestamp=on"},
	}
	if vm.Security.HasSeccomp() {
		parts = append(parts, sandbox{})
	}
	m := machine{Type: cmp.Or(o.Machine, vm.Machine)}
	if vm.Boot.Firmware == spec.FirmwareUEFI {
		for _, b := range ovmfBlockdevs(o.FirmwareCode, o.FirmwareVars) {
			parts = append(parts, b)
		}
		m.PFlash0, m.PFlash1 = OVMFCodeNodeName, OVMFVarsNodeName
		m.SMM = vm.Boot.SecureBoot
	}
	model := cmp.Or(vm.CPUModel, o.CPU, "max")
	if model == "max" && vm.CPUModel == "" && o.CPU == "" && o.Accel == spec.AccelKVM {
		model = "host"
	}
	if vm.SEV != nil {
		m.Confidential = SEVObjectID
		parts = append(parts, sevObject(*vm.SEV))
	}
	ram, hasRAM := mainRAMBackend(vm, o)
	if hasRAM {
		m.MemoryBackend = ram.ID // the -m memory, on hugetlbfs or shared
	}
	m.AuxRAMShare = RAMOf(vm, o).Shared
	hv, err := hypervProps(vm, o.Accel)
	if err != nil {
		return nil, err
	}
	parts = append(parts, m, accel{o.Accel, vm.MaxCPUs > vm.CPUs}, cpu{model, hv, o.CPUFeaturesOff},
		memory{Size: vm.Memory, Max: vm.MaxMemory, Slots: MemorySlots},
		smp{CPUs: vm.CPUs, Max: vm.MaxCPUs, Topology: vm.Topology})
	if hasRAM {
		parts = append(parts, ram)
	}
	numa, err := numaParts(vm, o)
	if err != nil {
		return nil, err
	}
	parts = append(parts, numa...)
	if vm.Boot.Firmware == spec.FirmwareQboot {
		parts = append(parts, biosFile{o.FirmwareCode})
	}
	if b := vm.Boot; b.Kernel != "" {
		parts = append(parts, kernelBoot{b.Kernel, b.Initrd, b.Cmdline})
	}
	if vm.Boot.IsStrict() && slices.ContainsFunc(vm.Disks, func(d spec.Disk) bool { return d.BootIndex > 0 }) {
		// Only with a boot order to be strict about: a file without any
		// boot_index keeps booting as the firmware finds its disks.
		parts = append(parts, bootStrict{})
	}
	return parts, nil
}

// sevObject is the sev-guest object the machine's
// confidential-guest-support names: QEMU encrypts the guest's memory with
// it, and refuses to start where KVM cannot (never an unencrypted guest).
func sevObject(s spec.SEV) Object {
	policy := s.Policy
	return Object{QOMType: "sev-guest", ID: SEVObjectID, Policy: &policy, CBitPos: s.CBitPos, ReducedPhysBits: s.ReducedPhysBits}
}

// monitorParts: the QMP monitors, the serial console, the event log.
func monitorParts(o Options) []renderer {
	parts := []renderer{
		socketChardev{QMPChardevID, o.QMPSocket, "", false}, qmpMonitor{QMPChardevID},
		socketChardev{EventsChardevID, o.EventSocket, "", false}, qmpMonitor{EventsChardevID},
		socketChardev{ConsoleChardevID, o.ConsoleSocket, o.ConsoleLog, o.Incoming}, serialPort{ConsoleChardevID},
	}
	if o.EventLog != "" {
		parts = append(parts, pipeChardev{EventLogChardevID, o.EventLog}, qmpMonitor{EventLogChardevID})
	}
	return parts
}

// platformParts: the root ports, the fixed slot's devices (agent, balloon,
// watchdog, RNG), the devices without a PCI slot and QEMU's actions.
func platformParts(vm *spec.VM, o Options, l pciLayout, idDevices []renderer) ([]renderer, error) {
	var parts []renderer
	for _, rp := range l.rootPorts {
		parts = append(parts, rp)
	}
	if vm.HasGuestAgent() {
		parts = append(parts, socketChardev{AgentChardevID, o.AgentSocket, "", false})
	}
	if vm.HasRNG() {
		parts = append(parts, Object{QOMType: "rng-random", ID: RNGObjectID, Filename: "/dev/urandom"})
	}
	for n := 1; n <= vm.IOThreads; n++ {
		parts = append(parts, Object{QOMType: "iothread", ID: SharedIOThreadID(n)})
	}
	shares, err := shareBackends(vm, o)
	if err != nil {
		return nil, err
	}
	parts = append(parts, shares...)
	for _, d := range slotDevices(l.agent, vm) {
		parts = append(parts, d)
	}
	if vm.OnPanic != "" {
		parts = append(parts, Device{Driver: "pvpanic", ID: PanicDeviceID}) // ISA, port 0x505: no PCI slot
	}
	switch {
	case vm.Watchdog == "":
	case vm.WatchdogModel == spec.WatchdogIB700:
		parts = append(parts, Device{Driver: "ib700", ID: WatchdogDeviceID}) // ISA, port 0x441/0x443
	case vm.WatchdogModel == spec.WatchdogITCO:
		// q35 always has the TCO watchdog; with noreboot on (a strap
		// pin) it never acts: off, its expiry takes -action watchdog.
		parts = append(parts, flags{"-global", "ICH9-LPC.noreboot=off"})
	}
	parts = append(parts, idDevices...) // vmgenid, vmcoreinfo: no PCI slot
	if a := panicActions(vm); len(a) > 0 {
		parts = append(parts, flags{"-action", strings.Join(a, ",")})
	}
	return parts, nil
}

// deviceParts: each NIC, then each disk, then each host device, on its
// place in the layout.
func deviceParts(vm *spec.VM, o Options, l pciLayout) ([]renderer, error) {
	var parts []renderer
	for i, n := range vm.NICs {
		if t := o.Taps[n.Name]; t != "" {
			n.Tap = t
		}
		nd, err := NICNetdev(n, o.VhostNet)
		if err != nil {
			return nil, nicInField(err, i, n.Name)
		}
		dev := NICDevice(n, l.nics[i].bus)
		dev.Addr = l.nics[i].addr
		parts = append(parts, nd, dev)
	}
	for i, d := range vm.Disks {
		dp, err := bootDisk(vm, o, l, i)
		if err != nil {
			return nil, err
		}
		if o.byFD(d) {
			continue // checked, plugged later over QMP (BootDisks)
		}
		parts = append(parts, dp.renderers()...)
	}
	if vm.Vsock.On() {
		parts = append(parts, VsockDevice(o.VsockCID, l.vsock.bus, l.vsock.addr))
	}
	hds, err := hostDevParts(vm, l)
	if err != nil {
		return nil, err
	}
	return append(parts, hds...), nil
}

// VsockDevice is the vhost-vsock-pci device of a guest with context id cid.
// QEMU opens /dev/vhost-vsock and sets the CID there; the kernel refuses a
// CID another vhost-vsock user holds ("unable to set guest cid: Address
// already in use"), which is why the caller allocates it.
func VsockDevice(cid uint32, bus, addr string) Device {
	return Device{Driver: "vhost-vsock-pci", ID: VsockDeviceID, Bus: bus, Addr: addr, GuestCID: cid}
}

// checkVsock: a VM with [vsock] needs a CID from the caller, the file's
// own when it fixes one.
func checkVsock(vm *spec.VM, o Options) error {
	v := vm.Vsock
	switch {
	case !v.On():
		return nil
	case o.VsockCID < spec.MinVsockCID || int64(o.VsockCID) > spec.MaxVsockCID:
		return errorf("vsock", "Options.VsockCID %d is not a guest CID (%d..%d; the caller allocates one)", o.VsockCID, spec.MinVsockCID, int64(spec.MaxVsockCID))
	case v.CID != 0 && int64(o.VsockCID) != v.CID:
		return errorf("vsock.cid", "the file fixes CID %d but Options.VsockCID is %d", v.CID, o.VsockCID)
	}
	return nil
}

// inField turns a per-device *Error into one with the full spec field path.
func inField(err error, prefix string) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	e.Object = ""
	e.Field = prefix + "." + e.Field
	return e
}

func checkOptions(vm *spec.VM, o Options) error {
	path := func(name, p string) error {
		field := "Options." + name
		if p == "" {
			return errorf(field, "missing")
		}
		if !filepath.IsAbs(p) {
			return errorf(field, "%q is not an absolute path", p)
		}
		if err := checkString(p); err != nil {
			return errorf(field, "%v", err)
		}
		return nil
	}
	if err := path("Binary", o.Binary); err != nil {
		return err
	}
	if o.CPU != "" {
		if err := spec.ValidCPUModel(o.CPU); err != nil {
			return errorf("Options.CPU", "%v", err)
		}
	}
	for _, f := range o.CPUFeaturesOff {
		if err := spec.ValidCPUModel(f); err != nil {
			return errorf("Options.CPUFeaturesOff", "invalid CPU feature %q", f)
		}
	}
	if o.Machine != "" && spec.MachineFamily(o.Machine) != spec.MachineFamily(vm.Machine) {
		return errorf("Options.Machine", "%q is not a machine type of the spec's family (%q)", o.Machine, vm.Machine)
	}
	switch o.Accel {
	case spec.AccelKVM, spec.AccelTCG:
	default:
		return errorf("Options.Accel", "%q is not a resolved accelerator (want %q or %q; the caller resolves %q)",
			o.Accel, spec.AccelKVM, spec.AccelTCG, spec.AccelAuto)
	}
	sockets := []struct{ name, path string }{
		{"QMPSocket", o.QMPSocket}, {"EventSocket", o.EventSocket}, {"ConsoleSocket", o.ConsoleSocket},
	}
	if vm.HasGuestAgent() {
		sockets = append(sockets, struct{ name, path string }{"AgentSocket", o.AgentSocket})
	}
	if vm.TPM != nil {
		sockets = append(sockets, struct{ name, path string }{"TPMSocket", o.TPMSocket})
	}
	if vm.Display.HasVNC() {
		sockets = append(sockets, struct{ name, path string }{"VNCSocket", o.VNCSocket})
	}
	for _, sh := range vm.Shares {
		if sh.Driver == spec.ShareVirtioFS {
			sockets = append(sockets, struct{ name, path string }{fmt.Sprintf("ShareSockets[%q]", sh.Tag), o.ShareSockets[sh.Tag]})
		}
	}
	seen := map[string]string{}
	for _, s := range sockets {
		if err := path(s.name, s.path); err != nil {
			return err
		}
		if len(s.path) > maxSocketPath {
			return errorf("Options."+s.name, "%q is longer than %d bytes, the limit for unix socket paths", s.path, maxSocketPath)
		}
		if other, dup := seen[s.path]; dup {
			return errorf("Options."+s.name, "%q is also Options.%s", s.path, other)
		}
		seen[s.path] = s.name
	}
	if o.EventLog != "" {
		if err := path("EventLog", o.EventLog); err != nil {
			return err
		}
	}
	if err := checkVsock(vm, o); err != nil {
		return err
	}
	if err := checkCPR(o, path); err != nil {
		return err
	}
	if vm.Hugepages != "" {
		if err := path("Hugetlbfs", o.Hugetlbfs); err != nil {
			return errorf("hugepages", "%s pages need the hugetlbfs mount for them: %v", vm.Hugepages, err)
		}
	}
	switch vm.Boot.Firmware {
	case spec.FirmwareUEFI:
		if err := path("FirmwareCode", o.FirmwareCode); err != nil {
			return err
		}
		return path("FirmwareVars", o.FirmwareVars)
	case spec.FirmwareQboot:
		return path("FirmwareCode", o.FirmwareCode)
	}
	return nil
}

func checkVM(vm *spec.VM, resolved spec.Accel) error {
	if err := spec.ValidName(vm.Name); err != nil {
		return errorf("name", "%v", err)
	}
	switch vm.Accel {
	case spec.AccelAuto, "":
	case spec.AccelKVM, spec.AccelTCG:
		if vm.Accel != resolved {
			return errorf("accel", "the VM asks for %q but Options.Accel is %q", vm.Accel, resolved)
		}
	default:
		return errorf("accel", "unknown accelerator %q", vm.Accel)
	}
	if m := vm.CPUModel; m != "" {
		if err := spec.ValidCPUModel(m); err != nil {
			return errorf("cpu_model", "%v", err)
		}
		if m == "host" && resolved != spec.AccelKVM {
			return errorf("cpu_model", "%q needs accel %q, not %q", m, spec.AccelKVM, resolved)
		}
	}
	if vm.CPUs < 1 || vm.CPUs > 255 {
		return errorf("cpus", "%d is out of range 1..255", vm.CPUs)
	}
	if vm.MaxCPUs < vm.CPUs || vm.MaxCPUs > 255 {
		return errorf("max_cpus", "%d must be between cpus (%d) and 255", vm.MaxCPUs, vm.CPUs)
	}
	if vm.Memory <= 0 || vm.Memory%spec.MiB != 0 {
		return errorf("memory", "%s is not a positive whole number of MiB", vm.Memory)
	}
	if vm.MaxMemory < vm.Memory || vm.MaxMemory%spec.MiB != 0 {
		return errorf("max_memory", "%s must be a whole number of MiB and at least memory (%s)", vm.MaxMemory, vm.Memory)
	}
	if err := checkBoot(vm.Boot); err != nil {
		return err
	}
	for i, d := range vm.Disks {
		if d.IOThreadID < 0 || d.IOThreadID > vm.IOThreads {
			return errorf(fmt.Sprintf("disk[%d].iothread_id", i), "%d: the VM has %d shared I/O threads", d.IOThreadID, vm.IOThreads)
		}
		for _, e := range d.IOThreadMap {
			if e.Thread < 1 || e.Thread > vm.IOThreads {
				return errorf(fmt.Sprintf("disk[%d].iothread_map", i), "thread %d: the VM has %d shared I/O threads", e.Thread, vm.IOThreads)
			}
		}
	}
	return checkUnique(vm)
}

func checkBoot(b spec.Boot) error {
	switch b.Firmware {
	case spec.FirmwareBIOS, spec.FirmwareUEFI:
	case spec.FirmwareQboot:
		if b.Kernel == "" {
			return errorf("boot.firmware", "qboot can only boot a kernel given in boot.kernel")
		}
	default:
		return errorf("boot.firmware", "unknown firmware %q", b.Firmware)
	}
	if b.Kernel == "" {
		if b.Initrd != "" || b.Cmdline != "" {
			return errorf("boot.kernel", "initrd and cmdline need a kernel")
		}
		return nil
	}
	for _, f := range []struct{ field, path string }{{"boot.kernel", b.Kernel}, {"boot.initrd", b.Initrd}} {
		if f.path == "" {
			continue
		}
		if !filepath.IsAbs(f.path) {
			return errorf(f.field, "%q is not an absolute path", f.path)
		}
		if err := checkString(f.path); err != nil {
			return errorf(f.field, "%v", err)
		}
	}
	if err := checkString(b.Cmdline); err != nil {
		return errorf("boot.cmdline", "%v", err)
	}
	return nil
}

// checkUnique rejects duplicate names, node names and MACs, which would make
// QEMU fail or two NICs clash on a network.
func checkUnique(vm *spec.VM) error {
	disks, nodes := map[string]int{}, map[string]int{}
	for i, d := range vm.Disks {
		if j, dup := disks[d.Name]; dup {
			return errorf(fmt.Sprintf("disk[%d].name", i), "duplicate disk name %q (also disk[%d])", d.Name, j)
		}
		disks[d.Name] = i
		if j, dup := nodes[DiskNodeName(d.Name)]; dup {
			return errorf(fmt.Sprintf("disk[%d].name", i), "node name %q of disk %q clashes with disk[%d]",
				DiskNodeName(d.Name), d.Name, j)
		}
		nodes[DiskNodeName(d.Name)] = i
	}
	nics, macs := map[string]int{}, map[string]int{}
	for i, n := range vm.NICs {
		if j, dup := nics[n.Name]; dup {
			return errorf(fmt.Sprintf("nic[%d].name", i), "duplicate NIC name %q (also nic[%d])", n.Name, j)
		}
		nics[n.Name] = i
		if hw, err := parseMAC(n.MAC); err == nil {
			if j, dup := macs[hw]; dup {
				return errorf(fmt.Sprintf("nic[%d].mac", i), "duplicate MAC %s (also nic[%d])", n.MAC, j)
			}
			macs[hw] = i
		}
	}
	hostdevs, addrs := map[string]int{}, map[string]int{}
	for i, h := range vm.HostDevs {
		if j, dup := hostdevs[h.Name]; dup {
			return errorf(fmt.Sprintf("hostdev[%d].name", i), "duplicate hostdev name %q (also hostdev[%d])", h.Name, j)
		}
		hostdevs[h.Name] = i
		if j, dup := addrs[h.Address]; dup {
			return errorf(fmt.Sprintf("hostdev[%d].address", i), "%s is also hostdev[%d]", h.Address, j)
		}
		addrs[h.Address] = i
	}
	return nil
}
