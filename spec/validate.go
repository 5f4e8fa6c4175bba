package spec

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// ValidName checks a VM, disk or NIC name: it becomes part of a unit name,
// a directory name and QEMU ids, so it must not carry "/", "..", spaces,
// commas or control characters.
func ValidName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("name is empty")
	case len(s) > MaxNameLen:
		return fmt.Errorf("name %q is longer than %d bytes", s, MaxNameLen)
	case strings.Contains(s, ".."):
		return fmt.Errorf("name %q contains \"..\"", s)
	case !nameRE.MatchString(s):
		return fmt.Errorf("name %q may only contain letters, digits, '_', '.', '-' and must start with a letter or digit", s)
	}
	return nil
}

// unitTypes are systemd's unit types: a VM name ending in ".TYPE" makes a
// unit name that reads as another unit's ("vmsup-x.service.service").
const unitTypes = "service socket device mount automount swap target path timer slice scope"

// ValidVMName checks the name of a new VM: ValidName, and its unit
// (vmsup-NAME.service) is one systemd's rules allow (255 bytes, letters,
// digits and ":-_.\", "@" only for instances) that reads as a VM's: not
// ending in "." or in a unit type's suffix, and none of vmsup's own units
// (Reserved: vmsup-api.service, vmsup-metrics.socket...). Commands on a VM
// that exists take any ValidName, so one named by an older vmsup can still
// be stopped and removed.
func ValidVMName(s string) error {
	if err := ValidName(s); err != nil {
		return err
	}
	lower := strings.ToLower(s)
	for _, t := range strings.Fields(unitTypes) {
		if strings.HasSuffix(lower, "."+t) {
			return fmt.Errorf("name %q ends in %q, a systemd unit type: its unit would be vmsup-%s.service; drop the suffix", s, "."+t, s)
		}
	}
	switch {
	case strings.HasSuffix(s, "."):
		return fmt.Errorf("name %q ends in \".\": its unit would be vmsup-%s.service", s, s)
	case Reserved(s) != nil:
		return Reserved(s)
	case len("vmsup-"+s+".service") > 255:
		return fmt.Errorf("name %q makes a unit name longer than systemd's 255 bytes", s)
	}
	return nil
}

// validate runs every independent check and returns all their errors, in
// file order (an *Errors): a user fixing a file wants the whole list at once.
func (f *File) validate() error { return f.joinErrors(f.validateList()) }

// validateList is validate's errors, in the order found. Checks that
// depend on each other stay in one function, which stops at its first
// error. An error about a field whose value was left out (f.bad: the wrong
// type, a misspelt key) is dropped: it says the same again.
func (f *File) validateList() []*Error {
	var errs []*Error
	add := func(err error) {
		if err == nil {
			return
		}
		var list *Errors
		if errors.As(err, &list) {
			errs = append(errs, list.List...)
			return
		}
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{File: f.Path, Msg: err.Error(), Err: err}
		}
		errs = append(errs, e)
	}
	for _, check := range []func() error{
		f.validateName, f.validateMachine, f.validateCPUs, f.validateMemory, f.validateStop,
		f.validateBoot, f.validateSecurity, f.validateLimits, f.validateHealth, f.validateFailure, f.validateIdentity,
		f.validateSATA, f.validateTopology, f.validatePinning, f.validateNUMA, f.validateGuestDevs,
		f.validateHugepages, f.validateSharedMemory, f.validateVsock, f.validateHostDevs, f.validatePlacement, f.validateTuning, f.validateSEV,
		f.validateSecurityGroups, f.validateDisplay, f.validateCPUFeatures,
	} {
		add(check())
	}
	for _, err := range f.validateDisks() {
		add(err)
	}
	for _, err := range f.validateNICs() {
		add(err)
	}
	kept := errs[:0]
	for _, e := range errs {
		if !slices.ContainsFunc(f.bad, func(b string) bool { return related(b, e.Field) }) {
			kept = append(kept, e)
		}
	}
	return kept
}

func (f *File) validateName() error {
	if f.VM.Name == "" {
		return f.Errorf("name", "missing (every VM needs a name)")
	}
	if err := ValidVMName(f.VM.Name); err != nil {
		return f.Errorf("name", "%v", err)
	}
	return nil
}

func (f *File) validateMachine() error {
	vm := &f.VM
	if MachineFamily(vm.Machine) == "" {
		return f.Errorf("machine", "unknown machine %q (want \"q35\", \"pc\", or a versioned pc-q35-X.Y or pc-i440fx-X.Y)", vm.Machine)
	}
	if s := vm.Slots(); s < 0 || s > 32 {
		return f.Errorf("hotplug_slots", "%d is out of range 0..32", s)
	}
	if !vm.Q35() && vm.Slots() != 0 {
		return f.Errorf("hotplug_slots", "root ports exist only on q35; machine %q hotplugs onto pci.0", vm.Machine)
	}
	return nil
}

func (f *File) validateCPUs() error {
	vm := &f.VM
	switch vm.Accel {
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return f.Errorf("accel", "unknown accelerator %q (want \"auto\", \"kvm\" or \"tcg\")", vm.Accel)
	}
	if vm.CPUModel != "" {
		if err := ValidCPUModel(vm.CPUModel); err != nil {
			return f.Errorf("cpu_model", "%v", err)
		}
		if vm.CPUModel == "host" && vm.Accel == AccelTCG {
			return f.Errorf("cpu_model", "\"host\" needs accel \"kvm\" (TCG has no host CPU to pass through)")
		}
	}
	if vm.CPUs < 1 || vm.CPUs > 255 {
		return f.Errorf("cpus", "%d is out of range 1..255", vm.CPUs)
	}
	if vm.MaxCPUs < vm.CPUs || vm.MaxCPUs > 255 {
		return f.Errorf("max_cpus", "%d must be between cpus (%d) and 255", vm.MaxCPUs, vm.CPUs)
	}
	return nil
}

func (f *File) validateMemory() error {
	vm := &f.VM
	if vm.Memory == 0 {
		return f.Errorf("memory", "missing (e.g. memory = \"512M\")")
	}
	if vm.Memory < 16*MiB {
		return f.Errorf("memory", "%s is below the minimum of 16M%s", vm.Memory, f.bytesHint("memory"))
	}
	if vm.Memory%MiB != 0 {
		return f.Errorf("memory", "%s is not a whole number of MiB%s", vm.Memory, f.bytesHint("memory"))
	}
	if vm.MaxMemory < vm.Memory || vm.MaxMemory%MiB != 0 {
		return f.Errorf("max_memory", "%s must be a whole number of MiB and at least memory (%s)%s", vm.MaxMemory, vm.Memory, f.bytesHint("max_memory"))
	}
	if t := vm.BalloonTarget; t != 0 {
		switch {
		case !vm.Balloon:
			return f.Errorf("balloon_target", "needs the balloon device (balloon = true)")
		case t < 64*MiB || t > vm.MaxMemory || t%MiB != 0:
			return f.Errorf("balloon_target", "%s must be a whole number of MiB from 64M to max_memory (%s)", t, vm.MaxMemory)
		}
	}
	return nil
}

func (f *File) validateStop() error {
	vm := &f.VM
	if vm.StopTimeout <= 0 || vm.StopTimeout > Duration(MaxStopTimeout) {
		return f.Errorf("stop_timeout", "%s is out of range: more than 0s, at most %s", vm.StopTimeout.D(), MaxStopTimeout)
	}
	switch vm.Shutdown {
	case ShutdownACPI:
	case ShutdownAgent:
		if !vm.HasGuestAgent() {
			return f.Errorf("shutdown", "\"agent\" needs the guest agent channel (guest_agent = false)")
		}
	default:
		return f.Errorf("shutdown", "unknown method %q (want \"acpi\" or \"agent\")", vm.Shutdown)
	}
	return nil
}

func (f *File) validateLimits() error {
	l := f.VM.Limits
	if l.CPUQuota < 0 {
		return f.Errorf("limits.cpu_quota", "must not be negative")
	}
	if l.CPUWeight != 0 && (l.CPUWeight < 1 || l.CPUWeight > 10000) {
		return f.Errorf("limits.cpu_weight", "%d is out of range 1..10000", l.CPUWeight)
	}
	if l.TasksMax < 16 {
		return f.Errorf("limits.tasks_max", "%d is too low for QEMU (at least 16)", l.TasksMax)
	}
	return nil
}

func (f *File) validateBoot() error {
	b := f.VM.Boot
	switch b.Firmware {
	case FirmwareBIOS, FirmwareUEFI, FirmwareQboot:
	default:
		return f.Errorf("boot.firmware", "unknown firmware %q (want \"bios\", \"uefi\" or \"qboot\")", b.Firmware)
	}
	if b.Kernel == "" && (b.Initrd != "" || b.Cmdline != "") {
		return f.Errorf("boot.kernel", "initrd and cmdline need a kernel")
	}
	if b.Kernel == "" && b.Firmware == FirmwareQboot {
		return f.Errorf("boot.firmware", "qboot can only boot a kernel given in boot.kernel")
	}
	if b.Kernel == "" && len(f.VM.Disks) == 0 {
		return f.Errorf("boot", "nothing to boot: give boot.kernel or at least one disk")
	}
	if strings.ContainsAny(b.Cmdline, "\n\x00") {
		return f.Errorf("boot.cmdline", "contains a newline or NUL")
	}
	if b.CmdlineMax < 0 || b.CmdlineMax > MaxCmdline {
		return f.Errorf("boot.cmdline_max", "%d is out of range 0..%d", b.CmdlineMax, MaxCmdline)
	}
	if limit := cmp.Or(b.CmdlineMax, DefaultCmdlineMax); len(b.Cmdline) > limit {
		return f.Errorf("boot.cmdline", "%d bytes, more than the limit of %d (boot.cmdline_max raises it, up to %d)", len(b.Cmdline), limit, MaxCmdline)
	}
	return nil
}

func (f *File) validateDisks() []error {
	var errs []error
	seen := map[string]int{}
	ok := map[int]bool{}
	for i, d := range f.VM.Disks {
		field := fmt.Sprintf("disk[%d]", i)
		if err := ValidName(d.Name); err != nil {
			errs = append(errs, f.Errorf(field+".name", "%v", err))
			continue
		}
		if j, dup := seen[d.Name]; dup {
			errs = append(errs, f.Errorf(field+".name", "duplicate disk name %q (also disk[%d])", d.Name, j))
			continue
		}
		seen[d.Name] = i
		if err := f.validateDisk(field+".", &d); err != nil {
			errs = append(errs, err)
			continue
		}
		ok[i] = !f.Broken(field)
	}
	return append(errs, f.validateSharedImages(ok)...)
}

func (f *File) validateNICs() []error {
	var errs []error
	names := map[string]int{}
	macs := map[string]int{}
	for i, n := range f.VM.NICs {
		if err := f.validateNIC(i, n, names, macs); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errs // the cross-NIC checks below assume each NIC is sound
	}
	// One host port, one forward: QEMU would fail to bind the second.
	ports := map[string]string{}
	for i, n := range f.VM.NICs {
		for k, fw := range n.Forwards {
			proto, host, port := ForwardHost(fw)
			if port == "0" {
				continue // any free port
			}
			key, field := proto+" "+host+":"+port, fmt.Sprintf("nic[%d].forwards[%d]", i, k)
			if prev, dup := ports[key]; dup {
				errs = append(errs, f.Errorf(field, "host port %s/%s is already forwarded by %s", port, proto, prev))
				continue
			}
			ports[key] = field
		}
	}
	if len(errs) > 0 {
		return errs
	}
	err := checkNetns(f.VM.NICs, func(i int, field, format string, args ...any) error {
		return f.Errorf(fmt.Sprintf("nic[%d].%s", i, field), format, args...)
	})
	if err != nil {
		return []error{err}
	}
	return nil
}

func (f *File) validateNIC(i int, n NIC, names, macs map[string]int) error {
	field := fmt.Sprintf("nic[%d]", i)
	if err := ValidName(n.Name); err != nil {
		return f.Errorf(field+".name", "%v", err)
	}
	if j, dup := names[n.Name]; dup {
		return f.Errorf(field+".name", "duplicate NIC name %q (also nic[%d])", n.Name, j)
	}
	names[n.Name] = i
	if fld, err := n.Check(); err != nil {
		return f.Errorf(field+"."+fld, "nic %q: %v", n.Name, err)
	}
	if err := validMAC(n.MAC); err != nil {
		return f.Errorf(field+".mac", "%v", err)
	}
	m := strings.ToLower(n.MAC)
	if j, dup := macs[m]; dup {
		return f.Errorf(field+".mac", "nic %q: duplicate MAC %s (also nic[%d] %q)", n.Name, n.MAC, j, f.VM.NICs[j].Name)
	}
	macs[m] = i
	for k, fw := range n.Forwards {
		if err := ValidForward(fw); err != nil {
			return f.Errorf(fmt.Sprintf("%s.forwards[%d]", field, k), "%v", err)
		}
	}
	return nil
}

var forwardRE = regexp.MustCompile(`^(tcp|udp):[0-9.]*:[0-9]{1,5}-[0-9.]*:[0-9]{1,5}$`)

// ValidForward checks a user-NIC host forward ("tcp:127.0.0.1:2222-:22").
func ValidForward(s string) error {
	if !forwardRE.MatchString(s) {
		return fmt.Errorf("invalid forward %q (want \"tcp:127.0.0.1:2222-:22\")", s)
	}
	return nil
}

// ForwardHost splits a valid forward ("tcp:127.0.0.1:2222-:22") into its
// protocol, host address ("" for all) and host port.
func ForwardHost(fw string) (proto, addr, port string) {
	proto, rest, _ := strings.Cut(fw, ":")
	host, _, _ := strings.Cut(rest, "-")
	i := strings.LastIndexByte(host, ':')
	if i < 0 {
		return proto, "", host
	}
	return proto, host[:i], host[i+1:]
}

// ValidCPUModel checks a QEMU CPU model name ("host", "max", "EPYC-v4").
func ValidCPUModel(s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("invalid CPU model %q", s)
	}
	return nil
}
