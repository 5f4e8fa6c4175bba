package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Host facts the start path depends on. Probed by probeHost; tests and
// embedders may pass their own through Options.Host.
type Host struct {
	MemTotal int64 // bytes of RAM
	// KVM is "" when /dev/kvm can run a stock guest, else why not
	// ("no /dev/kvm", "PVM: runs only PVM guest kernels", ...).
	KVMUnusable string
	// KVMOpenable: /dev/kvm opens read-write (QEMU can start with it even if
	// it cannot run a stock guest, as on PVM hosts).
	KVMOpenable bool
	// AppArmorUnusable is "" when the kernel enforces AppArmor and
	// apparmor_parser is there, else why not.
	AppArmorUnusable string
}

// ProbeHost reads the host facts from /proc, /sys and /dev.
func ProbeHost() Host {
	h := Host{MemTotal: memTotal(), AppArmorUnusable: units.AppArmorState()}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	switch {
	case err != nil:
		h.KVMUnusable = "cannot open /dev/kvm: " + errors.Unwrap(err).Error()
		if errors.Is(err, os.ErrNotExist) {
			h.KVMUnusable = "no /dev/kvm"
		}
	default:
		f.Close()
		h.KVMOpenable = true
		if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
			// PVM (kvm_pvm) starts QEMU but boots only PVM-built guest
			// kernels: "auto" must not pick it.
			h.KVMUnusable = "/dev/kvm is PVM (kvm_pvm), which runs only PVM guest kernels"
		} else if !cpuHasVirt() {
			h.KVMUnusable = "CPU has no vmx/svm"
		}
	}
	return h
}

func memTotal() int64 {
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

func cpuHasVirt() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
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

// resolveAccel turns the spec's accelerator choice into kvm or tcg, with the
// reason when it is not what the user might expect.
func resolveAccel(f *spec.File, h Host) (spec.Accel, string, error) {
	switch f.VM.Accel {
	case spec.AccelKVM:
		if !h.KVMOpenable {
			return "", "", f.Errorf("accel", "kvm requested but %s", h.KVMUnusable)
		}
		return spec.AccelKVM, h.KVMUnusable, nil
	case spec.AccelTCG:
		return spec.AccelTCG, "", nil
	default:
		if h.KVMUnusable == "" && h.KVMOpenable {
			return spec.AccelKVM, "", nil
		}
		return spec.AccelTCG, "auto chose tcg: " + h.KVMUnusable, nil
	}
}

// Firmware files of Debian's ovmf and qemu-system-data packages.
var (
	ovmfCode = []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_CODE.fd"}
	ovmfVars = []string{"/usr/share/OVMF/OVMF_VARS_4M.fd", "/usr/share/OVMF/OVMF_VARS.fd"}
	qbootROM = []string{"/usr/share/qemu/qboot.rom"}
)

func firstExisting(paths []string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// checkHost checks what the spec refers to on this host: files exist and are
// readable, memory fits, the accelerator is there. Errors name the field.
func checkHost(f *spec.File, h Host, qemu string) error {
	vm := &f.VM
	if _, err := exec.LookPath(qemu); err != nil {
		return fmt.Errorf("%s: QEMU binary %q not found (install qemu-system-x86)", f.Path, qemu)
	}
	if h.MemTotal > 0 && int64(vm.Memory) > h.MemTotal {
		return f.Errorf("memory", "%s is more than this host's RAM (%s)", vm.Memory, spec.Size(h.MemTotal))
	}
	if err := fileReadable(f, "boot.kernel", vm.Boot.Kernel); err != nil {
		return err
	}
	if err := fileReadable(f, "boot.initrd", vm.Boot.Initrd); err != nil {
		return err
	}
	// Disks are checked by checkStorage (images may be created on demand).
	switch vm.Boot.Firmware {
	case spec.FirmwareUEFI:
		if firstExisting(ovmfCode) == "" || firstExisting(ovmfVars) == "" {
			return f.Errorf("boot.firmware", "uefi needs OVMF (install the ovmf package)")
		}
	case spec.FirmwareQboot:
		if firstExisting(qbootROM) == "" {
			return f.Errorf("boot.firmware", "qboot needs %s (qemu-system-data)", qbootROM[0])
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
	if st.IsDir() {
		return f.Errorf(field, "%s is a directory", path)
	}
	return nil
}
