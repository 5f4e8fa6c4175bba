package caps

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/internal/host/userfile"
	"github.com/vmsup/vmsup/spec"
)

// MemTotal is the host's RAM in bytes (0 if /proc/meminfo does not say).
func MemTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fs[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// PhysBits is the host CPU's physical address width, as /proc/cpuinfo's
// "address sizes" says (0 if it does not).
func PhysBits() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return parsePhysBits(string(b))
}

// hostAMD reports whether /proc/cpuinfo's vendor_id is AuthenticAMD.
func hostAMD() bool {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Contains(string(b), "AuthenticAMD")
}

// parsePhysBits reads "address sizes	: 39 bits physical, 48 bits virtual".
func parsePhysBits(cpuinfo string) int {
	for _, l := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.TrimSpace(k) == "address sizes" {
			n, _, _ := strings.Cut(strings.TrimSpace(v), " ")
			bits, _ := strconv.Atoi(n)
			return bits
		}
	}
	return 0
}

// CheckSpec checks what the spec refers to on this host: QEMU, files that
// exist and are readable, memory that fits in memTotal bytes (0: unknown),
// firmware packages. Errors name the field, one per problem (f.Join).
func CheckSpec(f *spec.File, memTotal int64, qemu string) error {
	vm := &f.VM
	var errs []error
	if _, err := exec.LookPath(qemu); err != nil {
		errs = append(errs, fmt.Errorf("%s: QEMU binary %q not found (install qemu-system-x86)", f.Path, qemu))
	}
	if memTotal > 0 && int64(vm.Memory) > memTotal {
		errs = append(errs, f.Errorf("memory", "%s is more than this host's RAM (%s)", vm.Memory, spec.Size(memTotal)))
	}
	errs = append(errs, fileReadable(f, "boot.kernel", vm.Boot.Kernel), fileReadable(f, "boot.initrd", vm.Boot.Initrd),
		checkPinning(f), checkGuestDevs(f), checkFirmware(f), checkSEV(f, SEVReason))
	// Disks are checked by vmdisks.Manager.Check (images may be created on demand).
	return f.Join(errs...)
}

// checkSEV refuses an SEV guest on a host that cannot encrypt it: QEMU
// would fail at start, and vmsup never runs it unencrypted instead.
func checkSEV(f *spec.File, reason func() string) error {
	if f.VM.SEV == nil {
		return nil
	}
	if why := reason(); why != "" {
		return f.Errorf("sev", "this host cannot run SEV guests: %s", why)
	}
	return nil
}

// checkFirmware: the firmware files of boot.firmware are installed.
func checkFirmware(f *spec.File) error {
	b := f.VM.Boot
	switch b.Firmware {
	case spec.FirmwareUEFI:
		if BootCode(b) == "" || VarsTemplate(b) == "" {
			if b.SecureBoot {
				return f.Errorf("boot.secure_boot", "needs OVMF's Secure Boot build and keys (install the ovmf package)")
			}
			return f.Errorf("boot.firmware", "uefi needs OVMF (install the ovmf package)")
		}
		return fileReadable(f, "boot.vars_template", b.VarsTemplate)
	case spec.FirmwareQboot:
		if FirmwareCode(spec.FirmwareQboot) == "" {
			return f.Errorf("boot.firmware", "qboot needs %s (qemu-system-data)", QbootROM())
		}
	}
	return nil
}

func fileReadable(f *spec.File, field, path string) error {
	if path == "" {
		return nil
	}
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return f.Errorf(field, "%s: no such file", path)
		}
		return f.Errorf(field, "%v", err)
	}
	if !st.Mode().IsRegular() {
		// QEMU would block on a FIFO, and read a device without end.
		return f.Errorf(field, "%s is %s, not a regular file", path, userfile.Kind(st.Mode()))
	}
	return nil
}

// checkPinning refuses host CPUs this host does not have online.
func checkPinning(f *spec.File) error {
	p := f.VM.Pinning
	if len(p.VCPUs) == 0 && p.Emulator == "" {
		return nil
	}
	online, err := OnlineCPUs()
	if err != nil {
		return fmt.Errorf("%s: pinning: %w", f.Path, err)
	}
	list := strings.Join(spec.CPURanges(online), ",")
	for i, c := range p.VCPUs {
		if !slices.Contains(online, c) {
			return f.Errorf(fmt.Sprintf("pinning.vcpus[%d]", i), "host CPU %d is not online here (online: %s)", c, list)
		}
	}
	em, _ := spec.ParseCPUList(p.Emulator)
	for _, c := range em {
		if p.Emulator != "" && !slices.Contains(online, c) {
			return f.Errorf("pinning.emulator", "host CPU %d is not online here (online: %s)", c, list)
		}
	}
	return nil
}

// OnlineCPUs are the host CPUs the kernel runs now.
func OnlineCPUs() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, fmt.Errorf("host CPUs: %w", err)
	}
	return spec.ParseCPUList(strings.TrimSpace(string(b)))
}

// checkGuestDevs: the programs a [tpm] needs, and each share's folder.
func checkGuestDevs(f *spec.File) error {
	vm := &f.VM
	if vm.TPM != nil {
		for _, b := range []string{"swtpm", "swtpm_setup"} {
			if _, err := exec.LookPath(b); err != nil {
				return f.Errorf("tpm", "%s is not installed (apt-get install swtpm swtpm-tools)", b)
			}
		}
		if vm.Boot.Firmware == spec.FirmwareBIOS && isELF(vm.Boot.Kernel) {
			// Measured with QEMU 7.2: the guest kernel finds its ACPI root
			// table corrupt and runs without ACPI, so without the TPM.
			return f.Errorf("boot.kernel", "%s is an ELF kernel (PVH boot), which SeaBIOS's TPM set-up leaves without ACPI "+
				"and so without its TPM: boot the bzImage (vmlinuz) instead", vm.Boot.Kernel)
		}
	}
	for i, s := range vm.Shares {
		field := fmt.Sprintf("share[%d].path", i)
		fi, err := os.Stat(s.Path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return f.Errorf(field, "%s: no such directory", s.Path)
		case err != nil:
			return f.Errorf(field, "%v", err)
		case !fi.IsDir():
			return f.Errorf(field, "%s is not a directory", s.Path)
		}
		if s.Driver == spec.ShareVirtioFS {
			if _, err := VirtioFSD(); err != nil {
				return f.Errorf(fmt.Sprintf("share[%d].driver", i), "%v", err)
			}
		}
	}
	return nil
}

// virtiofsdPaths are where Debian 13 and Fedora install the Rust
// virtiofsd, whose options vmsup uses (Debian 12 ships none; QEMU's older
// C one, /usr/lib/qemu/virtiofsd, takes other options and is not used).
var virtiofsdPaths = []string{"/usr/libexec/virtiofsd", "/usr/bin/virtiofsd"}

// VirtioFSD finds virtiofsd; the error says that it is missing.
func VirtioFSD() (string, error) {
	for _, p := range virtiofsdPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("virtiofs needs virtiofsd, which is not installed (looked in %s and PATH; Debian 13 packages it as virtiofsd)",
		strings.Join(virtiofsdPaths, ", "))
}

// isELF reports whether the file at path starts like an ELF binary.
func isELF(path string) bool {
	if path == "" {
		return false
	}
	fh, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fh.Close()
	b := make([]byte, 4)
	_, err = io.ReadFull(fh, b)
	return err == nil && string(b) == "\x7fELF"
}
