package libvirtimport

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// Dropped is one element of the domain the VM file does not carry.
type Dropped struct {
	Element string // where in the domain, e.g. "devices/graphics[0] (spice)"
	Why     string
}

func (d Dropped) String() string { return d.Element + ": " + d.Why }

// Result is a converted domain.
type Result struct {
	Name    string    // the VM's name (the domain's, made valid)
	TOML    []byte    // the VM file, headed by comments listing Dropped
	Dropped []Dropped // in document order
}

// Options are what a conversion asks of the host it runs for.
type Options struct {
	// CheckPath, when set, is asked about every host path the VM file
	// would name, with its key as errors name it ("file", "secret_file",
	// "ceph_conf", "boot.kernel", "share.path"...): a path it refuses is
	// not written, and its element (the whole disk or share, the kernel
	// with its initrd and command line) is in Dropped with its error.
	// vmsup import gives the host's places (supervisor.CheckPath).
	CheckPath func(field, path string) error
	// CheckDisk, when set, is asked about each disk whose paths passed
	// CheckPath, as vmsup would open it: its image and backing chain as
	// objects (hard links, an external data file, a protocol base). A disk
	// it refuses is dropped with its error. vmsup import gives
	// supervisor.CheckDisk.
	CheckDisk func(d spec.Disk) error
	// NoSEV is why this host cannot run AMD SEV guests ("" when it can,
	// or when nobody asked: hostcaps.SEVReason). An SEV domain is carried
	// over either way (never as an unencrypted VM); with a reason its line
	// says vmsup will refuse to start it here.
	NoSEV string
	// ManagedNetworks are the names of this host's managed networks
	// (vmsup network ls). A NIC on a libvirt network of one of these
	// names goes on the managed network (type "network"), with
	// clean-traffic as its anti-spoofing; any other stays on the libvirt
	// network's bridge.
	ManagedNetworks []string
	// IOThreadVQMapping says this host's QEMU spreads a disk's queues over
	// several I/O threads (9.0 and newer: hostcaps): a disk's <iothreads>
	// mapping is carried as its iothread_map; without it the disk runs in
	// its first thread and the mapping is listed as not carried.
	IOThreadVQMapping bool
}

// Convert turns one libvirt domain XML into a vmsup VM file, with no host
// path checked (ConvertWith). source names the XML in the file's header.
// An error means the XML is not a domain vmsup can run at all (not
// KVM/QEMU x86-64, no memory, more devices than vmsup lays out); everything
// else it cannot express is in Dropped.
func Convert(domainXML []byte, source string) (*Result, error) {
	return ConvertWith(domainXML, source, Options{})
}

// ConvertWith is Convert with o's checks.
func ConvertWith(domainXML []byte, source string, o Options) (*Result, error) {
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(domainXML)); err != nil {
		return nil, fmt.Errorf("%s: not a libvirt domain XML: %w", source, err)
	}
	tree, err := parseTree(domainXML)
	if err != nil {
		return nil, fmt.Errorf("%s: not a libvirt domain XML: %w", source, err)
	}
	c := &converter{dom: &dom, check: o.CheckPath, disk: o.CheckDisk, noSEV: o.NoSEV, vqMapping: o.IOThreadVQMapping, networks: map[string]bool{}}
	for _, n := range o.ManagedNetworks {
		c.networks[n] = true
	}
	if err := c.domain(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if err := c.devices(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	if guestPCIAddresses(tree) {
		c.note("devices/address", "libvirt's PCI addresses: vmsup lays out its own (each NIC, then each disk, on a root port of its own), so the guest may see other PCI addresses and name its NICs anew")
	}
	c.dropped = append(c.dropped, unread(tree, knownPaths(), c.covered)...)
	if err := c.bootable(source); err != nil {
		return nil, err
	}
	data, err := c.write(source)
	if err != nil {
		return nil, err
	}
	return &Result{Name: c.out.Name, TOML: data, Dropped: c.dropped}, nil
}

// write renders the VM file: the header listing what was not carried
// over, then the keys. What it writes must load: a key spec refuses (a
// value past one of vmsup's limits) is taken out with a line saying why
// (repair), so no domain makes the import fail on it.
func (c *converter) write(source string) ([]byte, error) {
	for tries := 0; ; tries++ {
		body, err := c.encode()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		_, perr := spec.Parse(source+".toml", body)
		if perr == nil {
			return append(c.header(source), body...), nil
		}
		if tries >= maxRepairs || !c.repair(perr) {
			return nil, fmt.Errorf("%s: the converted file does not load (a vmsup import bug): %w", source, perr)
		}
		if err := c.bootable(source); err != nil {
			return nil, err
		}
	}
}

// bootable: a VM needs a disk or a kernel to boot from.
func (c *converter) bootable(source string) error {
	if len(c.out.Disks) > 0 || (c.out.Boot != nil && c.out.Boot.Kernel != "") {
		return nil
	}
	why := ""
	for _, d := range c.dropped {
		if strings.HasPrefix(d.Element, "devices/disk") {
			why = " (" + d.String() + ")"
			break
		}
	}
	return fmt.Errorf("%s: nothing vmsup can boot: no disk or kernel was carried over%s", source, why)
}

func (c *converter) encode() ([]byte, error) {
	var b bytes.Buffer
	enc := toml.NewEncoder(&b)
	enc.SetIndentTables(false)
	if err := enc.Encode(c.out); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func (c *converter) header(source string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Imported by vmsup import from %s (libvirt domain %q).\n", source, c.dom.Name)
	if len(c.dropped) == 0 {
		b.WriteString("# Everything in the domain was carried over.\n")
	} else {
		fmt.Fprintf(&b, "# Not carried over, or carried differently (%d):\n", len(c.dropped))
		for _, d := range c.dropped {
			fmt.Fprintf(&b, "#   %s\n", strings.ReplaceAll(d.String(), "\n", " "))
		}
	}
	b.WriteString("\n")
	return b.Bytes()
}

type converter struct {
	dom     *libvirtxml.Domain
	out     fileVM
	dropped []Dropped
	// covered are the paths of what drop said was not carried over: the
	// structural check does not list what is below them again.
	covered [][]seg
	check   func(field, path string) error // Options.CheckPath
	disk    func(d spec.Disk) error        // Options.CheckDisk
	noSEV   string                         // Options.NoSEV
	// networks are Options.ManagedNetworks.
	networks map[string]bool
	// iothreads maps the domain's I/O thread ids to vmsup's shared
	// threads (1..n, in the domain's order).
	iothreads map[uint]int
	vqMapping bool // Options.IOThreadVQMapping
}

// drop lists element (and all below it) as not carried over.
func (c *converter) drop(element, format string, args ...any) {
	c.note(element, format, args...)
	c.covered = append(c.covered, parsePath(element))
}

// note lists a change the guest may notice in something carried over;
// unlike drop it vouches for nothing below element.
func (c *converter) note(element, format string, args ...any) {
	c.dropped = append(c.dropped, Dropped{Element: element, Why: fmt.Sprintf(format, args...)})
}

// refused is why the host refuses field naming path ("" when it does not,
// or nothing is checked), as in "source /etc/shadow is outside ...".
func (c *converter) refused(what, field, path string) string {
	if c.check == nil || path == "" {
		return ""
	}
	if err := c.check(field, path); err != nil {
		return what + " " + err.Error()
	}
	return ""
}

var badNameChar = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// domain maps what is not a device: name, identity, memory, CPUs, boot,
// features, tuning.
func (c *converter) domain() error {
	d := c.dom
	switch d.Type {
	case "kvm", "qemu", "":
	default:
		return fmt.Errorf("domain type %q: vmsup runs QEMU (kvm or qemu domains)", d.Type)
	}
	if d.OS != nil && d.OS.Type != nil && d.OS.Type.Arch != "" && d.OS.Type.Arch != "x86_64" {
		return fmt.Errorf("architecture %q: vmsup runs x86_64 guests", d.OS.Type.Arch)
	}
	c.name()
	c.out.UUID = strings.ToLower(d.UUID)
	c.out.Description = strings.TrimSpace(strings.Join(nonEmpty(d.Title, d.Description), ": "))
	if err := c.memory(); err != nil {
		return err
	}
	c.cpus()
	c.os()
	c.features()
	c.sysinfo()
	c.tuning()
	c.memoryBacking()
	if err := c.launchSecurity(); err != nil {
		return err
	}
	if d.GenID != nil {
		c.out.VMGenID = true
		if d.GenID.Value != "" {
			c.drop("genid", "vmsup generates the VM's generation id itself (%s is not kept)", d.GenID.Value)
		}
	}
	for _, e := range []struct{ el, v, def string }{{"on_poweroff", d.OnPoweroff, "destroy"}, {"on_reboot", d.OnReboot, "restart"}} {
		if e.v != "" && e.v != e.def {
			c.drop(e.el, "%q: a vmsup guest that powers off stops and one that reboots restarts", e.v)
		}
	}
	if d.OnLockFailure != "" {
		c.drop("on_lockfailure", "vmsup holds image locks through QEMU itself")
	}
	if d.PM != nil {
		c.drop("pm", "guest suspend settings: QEMU's defaults apply")
	}
	c.clock(d.Clock)
	c.hypervNeeds()
	if len(d.SecLabel) > 0 {
		c.drop("seclabel", "vmsup confines each VM itself (its own user, an AppArmor profile, seccomp: [security])")
	}
	if d.Metadata != nil {
		c.drop("metadata", "application metadata (such as libosinfo's) has no vmsup counterpart")
	}
	if d.Resource != nil {
		c.drop("resource", "vmsup places each VM in its own systemd unit")
	}
	if d.QEMUCommandline != nil {
		c.drop("qemu:commandline", "extra QEMU arguments: vmsup builds the whole command line itself")
	}
	return nil
}

func nonEmpty(s ...string) []string {
	var out []string
	for _, v := range s {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func (c *converter) name() {
	n := c.dom.Name
	v := badNameChar.ReplaceAllString(n, "-")
	v = strings.TrimLeft(v, "_.-")
	if len(v) > spec.MaxNameLen {
		v = v[:spec.MaxNameLen]
	}
	if v == "" {
		v = "imported"
	}
	if v != n {
		c.drop("name", "%q is %q here: vmsup names are letters, digits, '_', '.', '-', at most %d bytes", n, v, spec.MaxNameLen)
	}
	c.out.Name = v
}

// bytesOf converts a libvirt memory value (default unit KiB).
func bytesOf(v uint, unit string) (uint64, error) {
	mult := map[string]uint64{"": 1 << 10, "b": 1, "bytes": 1, "k": 1 << 10, "KiB": 1 << 10, "KB": 1000,
		"M": 1 << 20, "MiB": 1 << 20, "MB": 1000 * 1000, "G": 1 << 30, "GiB": 1 << 30, "GB": 1000 * 1000 * 1000,
		"T": 1 << 40, "TiB": 1 << 40, "TB": 1000 * 1000 * 1000 * 1000}[unit]
	if mult == 0 {
		if m, ok := map[string]uint64{"K": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit]; ok {
			mult = m
		} else {
			return 0, fmt.Errorf("unknown memory unit %q", unit)
		}
	}
	return uint64(v) * mult, nil
}

// mib renders bytes as whole MiB, rounded up.
func mib(b uint64) (string, bool) {
	n := (b + (1<<20 - 1)) >> 20
	return fmt.Sprintf("%dM", n), n<<20 == b
}

func (c *converter) cpus() {
	d := c.dom
	if d.VCPU != nil && d.VCPU.Value > 0 {
		c.out.CPUs = d.VCPU.Value
		if cur := d.VCPU.Current; cur > 0 && cur < d.VCPU.Value {
			c.out.CPUs, c.out.MaxCPUs = cur, d.VCPU.Value
		}
		if d.VCPU.CPUSet != "" {
			c.drop("vcpu/@cpuset", "host CPU pinning is not in vmsup yet")
		}
		if d.VCPU.Placement == "auto" {
			c.drop("vcpu/@placement", "\"auto\" (numad): vmsup's VMs float over the host's CPUs unless pinned")
		}
	}
	if c.out.CPUs == 1 {
		c.out.CPUs = 0 // the default
	}
	cpu := d.CPU
	if cpu == nil || cpu.Mode == "" && cpu.Model == nil {
		c.out.CPUModel = LibvirtCPUModel
	}
	if cpu == nil {
		c.socketsDefault()
		return
	}
	c.cpuModel(cpu)
	if t := cpu.Topology; t == nil {
		c.socketsDefault()
	} else {
		dies := max(t.Dies, 1)
		slots := uint(t.Sockets * dies * t.Cores * t.Threads)
		switch {
		case t.Clusters > 1:
			c.drop("cpu/topology", "clusters: vmsup's topology is sockets, dies, cores, threads")
		case d.VCPU == nil || slots != d.VCPU.Value:
			c.drop("cpu/topology", "%d×%d×%d×%d slots do not match the domain's vCPUs", t.Sockets, dies, t.Cores, t.Threads)
		case t.Sockets > 1 || dies > 1 || t.Cores > 1 || t.Threads > 1:
			c.out.Topology = &fileTopology{Sockets: t.Sockets, Dies: t.Dies, Cores: t.Cores, Threads: t.Threads}
			if dies == 1 {
				c.out.Topology.Dies = 0
			}
		}
	}
}

// machine keeps libvirt's versioned machine type (pc-q35-6.2): the guest
// keeps the hardware it had, and a newer QEMU runs it as that type. What
// vmsup does not lay out, or a distribution's own type (pc-q35-rhel9.2.0),
// becomes its family's alias.
func (c *converter) machine(m string) {
	switch {
	case m == "" || m == spec.MachineQ35:
	case spec.MachineFamily(m) == spec.MachineQ35:
		c.out.Machine = m
	case spec.MachineFamily(m) == spec.MachinePC:
		c.out.Machine = m
	case strings.Contains(m, "q35"):
		c.note("os/type/@machine", "%q is not a versioned type vmsup takes (pc-q35-X.Y): q35, this QEMU's newest, it is", m)
	case strings.HasPrefix(m, "pc-"):
		c.out.Machine = spec.MachinePC
		c.note("os/type/@machine", "%q is not a versioned type vmsup takes (pc-i440fx-X.Y): pc, this QEMU's newest, it is", m)
	default:
		c.drop("os/type/@machine", "%q: vmsup runs q35 or pc; q35 it is", m)
	}
}

// onPC: the VM's machine is of the pc (i440fx) family.
func (c *converter) onPC() bool { return spec.MachineFamily(c.out.Machine) == spec.MachinePC }

func (c *converter) os() {
	o := c.dom.OS
	if o == nil {
		return
	}
	if o.Type != nil {
		c.machine(o.Type.Machine)
	}
	b := &fileBoot{Kernel: o.Kernel, Initrd: o.Initrd, Cmdline: o.Cmdline}
	if o.Firmware == "efi" || (o.Loader != nil && o.Loader.Type == "pflash") {
		b.Firmware = spec.FirmwareUEFI
		if o.Loader != nil && o.Loader.Secure == "yes" || firmwareWants(o.FirmwareInfo, "secure-boot") {
			b.SecureBoot = !c.onPC() // SMM: q35 only
			if !b.SecureBoot {
				c.drop("os/loader/@secure", "Secure Boot needs q35 (SMM) in vmsup: plain OVMF it is")
			}
		}
		if o.NVRam != nil && o.NVRam.Template != "" {
			b.VarsTemplate = o.NVRam.Template
		}
		if o.NVRam != nil && o.NVRam.NVRam != "" {
			c.drop("os/nvram", "vmsup keeps the VM's own UEFI variable store: copy %s over it to keep the variables (when both are the 4 MiB build)", o.NVRam.NVRam)
		}
		c.loader(o.Loader, b.SecureBoot)
	}
	c.bootPaths(b)
	if o.BootMenu != nil {
		c.drop("os/bootmenu", "the firmware's boot menu needs a display, which vmsup VMs have not")
	}
	if o.SMBios != nil && o.SMBios.Mode != "sysinfo" {
		c.drop("os/smbios", "mode %q: vmsup's SMBIOS strings are the [smbios] table", o.SMBios.Mode)
	}
	if *b != (fileBoot{}) {
		c.out.Boot = b
	}
}

// firmwareWants reports whether libvirt's firmware autoselection asks for
// feature (secure-boot; enrolled-keys is vmsup's default store with it).
func firmwareWants(fi *libvirtxml.DomainOSFirmwareInfo, feature string) bool {
	if fi == nil {
		return false
	}
	for _, f := range fi.Features {
		if f.Name == feature && f.Enabled == "yes" {
			return true
		}
	}
	return false
}

// loader notes a firmware file other than the one vmsup runs: the
// distribution's 4 MiB OVMF build (Secure Boot's with secure_boot).
func (c *converter) loader(l *libvirtxml.DomainLoader, secure bool) {
	if l == nil || l.Path == "" {
		return
	}
	ours := "/usr/share/OVMF/OVMF_CODE_4M.fd"
	if secure {
		ours = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	}
	if l.Path != ours {
		c.note("os/loader", "%s: vmsup runs the host's %s (the 4 MiB build, whose variable store differs from the 2 MiB one's)", l.Path, ours)
	}
}

// bootPaths drops the boot files the host refuses: a kernel with its
// initrd and command line (they need it), an initrd, a variable store's
// template (the firmware's own is used).
func (c *converter) bootPaths(b *fileBoot) {
	if why := c.refused("kernel", "boot.kernel", b.Kernel); why != "" {
		c.drop("os/kernel", "%s", why)
		b.Kernel, b.Initrd, b.Cmdline = "", "", ""
	}
	if why := c.refused("initrd", "boot.initrd", b.Initrd); why != "" {
		c.drop("os/initrd", "%s", why)
		b.Initrd = ""
	}
	if why := c.refused("template", "boot.vars_template", b.VarsTemplate); why != "" {
		c.drop("os/nvram/@template", "%s", why)
		b.VarsTemplate = ""
	}
}

func (c *converter) features() {
	f := c.dom.Features
	off := false
	c.out.VMCoreInfo = &off // libvirt adds it only when asked
	if f == nil {
		return
	}
	if f.VMCoreInfo != nil && f.VMCoreInfo.State != "off" {
		c.out.VMCoreInfo = nil // vmsup's default: on
	}
	c.hyperv(f.HyperV)
	for _, x := range []struct {
		name string
		set  bool
	}{{"kvm", f.KVM != nil}, {"smm", f.SMM != nil}, {"pmu", f.PMU != nil},
		{"vmport", f.VMPort != nil}, {"ioapic", f.IOAPIC != nil}, {"pvspinlock", f.PVSpinlock != nil},
		{"msrs", f.MSRS != nil}, {"hap", f.HAP != nil}} {
		if x.set {
			c.drop("features/"+x.name, "QEMU's default for the machine applies")
		}
	}
}

func (c *converter) sysinfo() {
	for i, si := range c.dom.SysInfo {
		s := si.SMBIOS
		if s == nil {
			c.drop(fmt.Sprintf("sysinfo[%d]", i), "only SMBIOS sysinfo maps to vmsup")
			continue
		}
		out := &fileSMBIOS{}
		if s.System != nil {
			for _, e := range s.System.Entry {
				v := strings.TrimSpace(e.Value)
				switch e.Name {
				case "manufacturer":
					out.Manufacturer = v
				case "product":
					out.Product = v
				case "version":
					out.Version = v
				case "serial":
					out.Serial = v
				case "sku":
					out.SKU = v
				case "family":
					out.Family = v
				case "uuid": // the domain's uuid
				default:
					c.drop("sysinfo/system/entry[@name="+e.Name+"]", "not a type 1 string vmsup sets")
				}
			}
		}
		if s.OEMStrings != nil {
			for _, e := range s.OEMStrings.Entry {
				if name, value, ok := strings.Cut(strings.TrimPrefix(e, spec.CredentialPrefix), "="); ok && strings.HasPrefix(e, spec.CredentialPrefix) {
					if c.out.Credentials == nil {
						c.out.Credentials = map[string]string{}
					}
					c.out.Credentials[name] = value
					continue
				}
				out.OEMStrings = append(out.OEMStrings, e)
			}
		}
		for _, x := range []struct {
			el  string
			set bool
		}{{"bios", s.BIOS != nil}, {"baseBoard", len(s.BaseBoard) > 0}, {"chassis", s.Chassis != nil},
			{"processor", len(s.Processor) > 0}, {"memory_device", len(s.Memory) > 0}} {
			if x.set {
				c.drop("sysinfo/"+x.el, "vmsup sets SMBIOS type 1 and 11 strings only")
			}
		}
		if out.Manufacturer+out.Product+out.Version+out.Serial+out.SKU+out.Family != "" || len(out.OEMStrings) > 0 {
			c.out.SMBIOS = out
		}
	}
}

func (c *converter) tuning() {
	d := c.dom
	c.ioThreads()
	if t := d.CPUTune; t != nil {
		if t.Quota != nil && t.Quota.Value > 0 {
			period := uint64(100000)
			if t.Period != nil && t.Period.Value > 0 {
				period = t.Period.Value
			}
			// libvirt's quota is per vCPU; systemd's CPUQuota is for the unit.
			vcpus := uint64(max(c.out.CPUs, 1))
			c.out.Limits = &fileLimits{CPUQuota: int(uint64(t.Quota.Value) * 100 * vcpus / period)}
		}
		if t.Shares != nil {
			c.drop("cputune/shares", "cgroup v1 shares: set limits.cpu_weight (cgroup v2, 1..10000) instead")
		}
		c.pinning(t)
	}
	for _, x := range []struct {
		el  string
		set bool
		why string
	}{{"memtune", d.MemoryTune != nil, "the unit's MemoryMax is memory + limits.memory_overhead"},
		{"numatune", d.NUMATune != nil, "NUMA placement is not in vmsup yet"},
		{"blkiotune", d.BlockIOTune != nil, "per-disk limits (iops, bps) are vmsup's I/O tuning"}} {
		if x.set {
			c.drop(x.el, "%s", x.why)
		}
	}
}

// pinning maps vcpupin (when every vCPU slot is pinned to one CPU, vmsup's
// form) and emulatorpin.
func (c *converter) pinning(t *libvirtxml.DomainCPUTune) {
	p := &filePinning{}
	if n := len(t.VCPUPin); n > 0 {
		slots := 0
		if c.dom.VCPU != nil {
			slots = int(c.dom.VCPU.Value)
		}
		cpus := make([]int, slots)
		ok := n == slots
		for _, pin := range t.VCPUPin {
			set, err := spec.ParseCPUList(pin.CPUSet)
			if !ok || err != nil || len(set) != 1 || int(pin.VCPU) >= slots {
				ok = false
				break
			}
			cpus[pin.VCPU] = set[0]
		}
		if ok {
			p.VCPUs = cpus
		} else {
			c.drop("cputune/vcpupin", "vmsup pins every vCPU slot to one host CPU each (pinning.vcpus): give all %d", slots)
		}
	}
	if e := t.EmulatorPin; e != nil {
		if _, err := spec.ParseCPUList(e.CPUSet); err == nil {
			p.Emulator = e.CPUSet
		} else {
			c.drop("cputune/emulatorpin", "%q is not a CPU list", e.CPUSet)
		}
	}
	if len(t.IOThreadPin) > 0 {
		c.drop("cputune/iothreadpin", "vmsup's I/O threads follow pinning.emulator")
	}
	if len(p.VCPUs) > 0 || p.Emulator != "" {
		c.out.Pinning = p
	}
}
