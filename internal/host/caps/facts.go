package caps

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// kvmMinor is KVM's fixed misc-device minor (KVM_MINOR); major 10 is misc.
const kvmMinor = 232

// fsys reads host files below a root ("/" on a real host; a fake tree in
// tests).
type fsys string

func (r fsys) path(p string) string { return filepath.Join(string(r), p) }

func (r fsys) read(p string) (string, error) {
	b, err := os.ReadFile(r.path(p))
	return strings.TrimSpace(string(b)), err
}

func (r fsys) exists(p string) bool {
	_, err := os.Stat(r.path(p))
	return err == nil
}

// kvmDevice describes /dev/kvm for the cache key and says whether QEMU
// can open it and, if not, why.
func kvmDevice(dev string) (desc string, opens bool, why string) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "absent", false, "no " + dev
		}
		return "stat: " + err.Error(), false, "cannot stat " + dev + ": " + err.Error()
	}
	maj, mnr := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	// Not the mode: vmsup's own ACL for a running VM's QEMU user shows in
	// the group bits, and a key that changed with it re-probed (a QEMU
	// run, about half a second) on every command while VMs came and went.
	desc = fmt.Sprintf("char %d:%d", maj, mnr)
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || maj != 10 || mnr != kvmMinor {
		return desc + " not KVM", false, fmt.Sprintf("%s is not the KVM device (%s; KVM is char 10:%d)", dev, desc, kvmMinor)
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return desc + " does not open", false, "cannot open " + dev + ": " + errors.Unwrap(err).Error()
	}
	f.Close()
	return desc + " opens", true, ""
}

// userfaultfdFact says whether the unprivileged QEMU of version can use
// userfaultfd (postcopy migration): through the syscall when the sysctl
// allows it, or, from QEMU 8.1, through /dev/userfaultfd when its user may
// open the device.
func userfaultfdFact(root fsys, version string) Fact {
	v, err := root.read("/proc/sys/vm/unprivileged_userfaultfd")
	switch {
	case err != nil:
		return Fact{Reason: "this kernel has no userfaultfd (no /proc/sys/vm/unprivileged_userfaultfd)"}
	case v == "1":
		return Fact{OK: true, Detail: "vm.unprivileged_userfaultfd = 1"}
	}
	why := "vm.unprivileged_userfaultfd = " + v + ": the unprivileged QEMU cannot use userfaultfd (postcopy migration); "
	if !versionAtLeast(version, 8, 1) {
		return Fact{Reason: why + "QEMU " + version + " does not use /dev/userfaultfd (8.1 and newer do)"}
	}
	var st unix.Stat_t
	if err := unix.Stat(root.path("/dev/userfaultfd"), &st); err != nil {
		return Fact{Reason: why + "QEMU " + version + " would use /dev/userfaultfd, which this host lacks"}
	}
	if st.Mode&0o006 == 0o006 {
		return Fact{OK: true, Detail: fmt.Sprintf("QEMU %s opens /dev/userfaultfd (mode %04o)", version, st.Mode&0o7777)}
	}
	return Fact{Reason: why + fmt.Sprintf("QEMU %s would use /dev/userfaultfd, but it is mode %04o, owner %d: its user cannot open it",
		version, st.Mode&0o7777, st.Uid)}
}

// versionAtLeast reports whether a QEMU version ("10.0.2") is major.minor or
// newer; an unreadable one is not.
func versionAtLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// kvmModule names the loaded KVM vendor module.
func kvmModule(root fsys) string {
	for _, m := range []string{"kvm_pvm", "kvm_intel", "kvm_amd"} {
		if root.exists("/sys/module/" + m) {
			return m
		}
	}
	return ""
}

// kvmKind classifies KVM from the device and the module.
func kvmKind(root fsys, opens bool, why, module string) (string, string) {
	switch {
	case !opens:
		return KVMNone, why
	case module == "kvm_pvm":
		return KVMPVM, "/dev/kvm is PVM (kvm_pvm), which runs only PVM guest kernels"
	case cpuHasVirt(root):
		return KVMFull, ""
	}
	return KVMPVM, "KVM opens but the CPU shows no vmx/svm (nested without them?): stock guests may not boot"
}

func cpuHasVirt(root fsys) bool {
	s, err := root.read("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "flags") {
			for _, f := range strings.Fields(line) {
				if f == "vmx" || f == "svm" {
					return true
				}
			}
			return false
		}
	}
	return false
}

// helperBinaries are the programs vmsup or its later features run.
func helperBinaries() map[string][]string {
	return map[string][]string{
		"qemu-img":        nil,
		"virtiofsd":       {"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"},
		"swtpm":           nil,
		"swtpm_setup":     nil,
		"etcd":            nil,
		"ceph":            nil,
		"rbd":             nil,
		"iscsiadm":        nil,
		"tgtd":            nil,
		"apparmor_parser": nil,
		"ovs-vsctl":       nil,
		"ovs-vswitchd":    nil,
	}
}

func probeFacts(root fsys, q QEMU) Facts {
	f := Facts{Helpers: map[string]Fact{}}
	f.VhostNet = devFact(root, "/dev/vhost-net", "the vhost_net module is not loaded or this kernel lacks it: virtio-net runs in QEMU")
	f.VhostVsock = devFact(root, "/dev/vhost-vsock", "the vhost_vsock module is not loaded or this kernel lacks it: no vsock devices")
	f.Userfaultfd = userfaultfdFact(root, q.Version)
	switch v, err := root.read("/proc/sys/kernel/io_uring_disabled"); {
	case !q.IOURing:
		f.IOURing = Fact{Reason: "QEMU was built without io_uring"}
	case err == nil && v != "0":
		f.IOURing = Fact{Reason: "kernel.io_uring_disabled = " + v}
	default:
		f.IOURing = Fact{OK: true, Detail: "QEMU has aio=io_uring"}
	}
	f.AppArmor = appArmorFact(root)
	switch {
	case root.exists("/sys/module/openvswitch"):
		f.OVSDatapath = Fact{OK: true, Detail: "kernel datapath (openvswitch module)"}
	default:
		why := "no openvswitch kernel module: OVS bridges need datapath_type=netdev (userspace datapath)"
		if _, err := exec.LookPath("ovs-vswitchd"); err != nil {
			why = "Open vSwitch is not installed (package openvswitch-switch) and this kernel has no openvswitch module"
		}
		f.OVSDatapath = Fact{Reason: why}
	}
	f.Hugepages = hugepagesFact(root)
	if ents, err := os.ReadDir(root.path("/sys/kernel/iommu_groups")); err == nil && len(ents) > 0 {
		f.IOMMU = Fact{OK: true, Detail: fmt.Sprintf("%d IOMMU groups", len(ents))}
	} else {
		f.IOMMU = Fact{Reason: "no IOMMU groups (no IOMMU, or it is off: intel_iommu=on / amd_iommu): no VFIO passthrough"}
	}
	for name, extra := range helperBinaries() {
		f.Helpers[name] = binaryFact(name, extra)
	}
	return f
}

func devFact(root fsys, dev, why string) Fact {
	var st unix.Stat_t
	if err := unix.Stat(root.path(dev), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return Fact{Reason: "no " + dev + ": " + why}
	}
	return Fact{OK: true, Detail: dev}
}

// AppArmorReason is "" when the kernel enforces AppArmor and
// apparmor_parser is installed, else why not.
func AppArmorReason() string { return appArmorFact("/").Reason }

func appArmorFact(root fsys) Fact {
	v, err := root.read("/sys/module/apparmor/parameters/enabled")
	switch {
	case errors.Is(err, os.ErrNotExist):
		return Fact{Reason: "this kernel has no AppArmor (/sys/module/apparmor/parameters/enabled does not exist)"}
	case err != nil:
		return Fact{Reason: "cannot tell whether AppArmor is enabled: " + err.Error()}
	case v != "Y":
		return Fact{Reason: "AppArmor is disabled in this kernel (/sys/module/apparmor/parameters/enabled = " + v + ")"}
	}
	if _, err := exec.LookPath("apparmor_parser"); err != nil {
		return Fact{Reason: "apparmor_parser is not installed (package apparmor)"}
	}
	return Fact{OK: true, Detail: "enforcing"}
}

func hugepagesFact(root fsys) Fact {
	dirs, _ := filepath.Glob(root.path("/sys/kernel/mm/hugepages/hugepages-*"))
	sort.Strings(dirs)
	var parts []string
	free := false
	for _, d := range dirs {
		size := strings.TrimPrefix(filepath.Base(d), "hugepages-")
		n, _ := os.ReadFile(filepath.Join(d, "nr_hugepages"))
		fr, _ := os.ReadFile(filepath.Join(d, "free_hugepages"))
		nf, _ := strconv.Atoi(strings.TrimSpace(string(fr)))
		free = free || nf > 0
		parts = append(parts, fmt.Sprintf("%s: %d free of %s", size, nf, strings.TrimSpace(string(n))))
	}
	switch {
	case len(dirs) == 0:
		return Fact{Reason: "this kernel has no hugetlbfs page sizes"}
	case !free:
		return Fact{Detail: strings.Join(parts, ", "), Reason: "no free hugepages (reserve some: echo N > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)"}
	}
	return Fact{OK: true, Detail: strings.Join(parts, ", ")}
}

func binaryFact(name string, extra []string) Fact {
	if p, err := exec.LookPath(name); err == nil {
		return Fact{OK: true, Detail: p}
	}
	for _, p := range extra {
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return Fact{OK: true, Detail: p}
		}
	}
	return Fact{Reason: name + " is not installed"}
}

// SEVReason is "" when this host can run AMD SEV guests (KVM's kvm_amd
// module with sev on, and /dev/sev for QEMU's launch commands), else why
// not.
func SEVReason() string { return sevFact("/").Reason }

func sevFact(root fsys) Fact {
	v, err := root.read("/sys/module/kvm_amd/parameters/sev")
	switch {
	case err != nil:
		return Fact{Reason: "no AMD SEV here: the kvm_amd module is not loaded (/sys/module/kvm_amd/parameters/sev does not exist)"}
	case v != "Y" && v != "1":
		return Fact{Reason: "kvm_amd runs with sev = " + v + " (SEV is off in the firmware or the module)"}
	}
	if f := devFact(root, "/dev/sev", "the ccp driver has no SEV firmware interface"); !f.OK {
		return f
	}
	return Fact{OK: true, Detail: "kvm_amd sev = " + v + ", /dev/sev"}
}
