package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/internal/hostcaps"
	"github.com/vmsup/vmsup/spec"
)

// Host facts the start path depends on, derived from the host probe
// (HostCaps). Tests and embedders may pass their own through Options.Host;
// the probe then does not run.
type Host struct {
	MemTotal int64 // bytes of RAM
	// KVM is "" when /dev/kvm can run a stock guest, else why not
	// ("no /dev/kvm", "PVM: runs only PVM guest kernels", ...).
	KVMUnusable string
	// KVMOpenable: QEMU starts under KVM (even if it cannot run a stock
	// guest, as on PVM hosts).
	KVMOpenable bool
	// AppArmorUnusable is "" when the kernel enforces AppArmor and
	// apparmor_parser is there, else why not.
	AppArmorUnusable string
}

// HostCaps is what this host's QEMU and KVM can run, as the host probe
// found (see internal/hostcaps).
type HostCaps = hostcaps.Caps

// HostFact is one yes/no fact of HostCaps, with what was found or why not.
type HostFact = hostcaps.Fact

// ProbeHost reads the host facts from /proc, /sys and /dev, without asking
// QEMU (Supervisor.HostCaps does).
func ProbeHost() Host {
	h := Host{MemTotal: memTotal(), AppArmorUnusable: hostcaps.AppArmorReason()}
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
			h.KVMUnusable = "/dev/kvm is PVM (kvm_pvm), which runs only PVM guest kernels"
		}
	}
	return h
}

// HostCaps returns the host probe's record: from Options.HostCaps, else
// from the cache under Root/cache (kept while the QEMU binary, the kernel
// and /dev/kvm stay the same), else by probing. refresh probes again.
func (s *Supervisor) HostCaps(ctx context.Context, refresh bool) (*HostCaps, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.caps != nil && !refresh {
		return s.caps, nil
	}
	if s.opts.HostCaps != nil && !refresh {
		s.caps = s.opts.HostCaps
		return s.caps, nil
	}
	c, err := hostcaps.Probe(ctx, hostcaps.Options{QEMU: s.opts.QEMU, Refresh: refresh, CacheFile: s.opts.HostCapsCache})
	if err != nil {
		return nil, err
	}
	s.caps = c
	return c, nil
}

// hostFacts are the Host facts: Options.Host, or what the probe says.
func (s *Supervisor) hostFacts() Host {
	if s.opts.Host != nil {
		return *s.opts.Host
	}
	h := Host{MemTotal: memTotal()}
	c, err := s.HostCaps(context.Background(), false)
	if err != nil {
		h.KVMUnusable, h.AppArmorUnusable = err.Error(), err.Error()
		return h
	}
	h.AppArmorUnusable = c.Facts.AppArmor.Reason
	h.KVMOpenable, h.KVMUnusable = c.KVM.Starts()
	if h.KVMOpenable && c.KVM.Kind != hostcaps.KVMFull {
		h.KVMUnusable = c.KVM.Reason
	}
	return h
}

// cpuChoice is the CPU model and masks a VM runs with under accel.
type cpuChoice struct {
	Model string
	Masks []string
}

// resolveHost turns the spec's accelerator and CPU model into what this
// host runs: from the probe, or from Options.Host (no probe: no masks).
// Errors name the field and say what would work instead.
func (s *Supervisor) resolveHost(f *spec.File) (spec.Accel, string, cpuChoice, error) {
	if s.opts.Host != nil && s.opts.HostCaps == nil {
		a, why, err := resolveAccel(f, *s.opts.Host)
		return a, why, cpuChoice{}, err
	}
	c, err := s.HostCaps(context.Background(), false)
	if err != nil {
		return "", "", cpuChoice{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	if err := c.Check(); err != nil {
		return "", "", cpuChoice{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	if !c.HasMachine(f.VM.Machine) {
		return "", "", cpuChoice{}, f.Errorf("machine", "QEMU %s has no machine type %q (q35 and pc are what vmsup lays out)", c.QEMU.Version, f.VM.Machine)
	}
	accel, why, err := c.Accel(f.VM.Accel)
	if err != nil {
		return "", "", cpuChoice{}, f.Errorf("accel", "%v", err)
	}
	model, masks, err := c.CPU(accel, f.VM.CPUModel)
	if err != nil {
		field := "cpu_model"
		if f.VM.CPUModel == "" {
			field = "accel"
		}
		return "", "", cpuChoice{}, f.Errorf(field, "%v", err)
	}
	if len(masks) > 0 {
		why = strings.TrimPrefix(why+"; ", "; ") + fmt.Sprintf("-cpu %s with %s off (this KVM refuses it otherwise)", model, strings.Join(masks, ", "))
	}
	return accel, why, cpuChoice{Model: model, Masks: masks}, nil
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

// resolveAccel turns the spec's accelerator choice into kvm or tcg from
// Host facts alone (Options.Host), with the reason when it is not what the
// user might expect.
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
