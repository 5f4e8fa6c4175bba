package qemuargs

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// TestPhysBitsInQEMU starts this host's QEMU (stopped, -S) with vmsup's
// own argv at the largest max_memory MaxMemoryFor allows, which must
// start, and at 1 GiB more, 1 TiB and 1 PiB (libvirt's memory-hotplug-dimm),
// which QEMU must refuse
// with "phys-bits too low (N)" for the same N and the same top address
// PhysBitsError names: validate's figures are QEMU's, on q35 and pc, with
// RAM below and across 4 GiB, for AMD models (qemu64, max under TCG:
// QEMU moves their RAM above 1 TiB), an Intel one, and the host's CPU
// under KVM with the phys-bits read from /proc/cpuinfo.
func TestPhysBitsInQEMU(t *testing.T) {
	env := needQEMU(t)
	host := env.caps.Host()
	cases := []struct {
		machine, memory string
		accel           spec.Accel
		model           string
	}{{"q35", "214M", spec.AccelTCG, "qemu64"}, {"q35", "214M", spec.AccelTCG, "Skylake-Client"}, {"q35", "214M", spec.AccelTCG, "max"},
		{"pc", "214M", spec.AccelTCG, "qemu64"}, {"pc", "214M", spec.AccelTCG, "Skylake-Client"},
		// RAM past the PCI hole: part of it above 4 GiB.
		{"q35", "3G", spec.AccelTCG, "Skylake-Client"}, {"pc", "3712M", spec.AccelTCG, "qemu64"},
		{"q35", "214M", spec.AccelKVM, ""}}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s-%s-%s-%s", c.machine, c.memory, c.accel, cmp.Or(c.model, "probed")), func(t *testing.T) {
			o := Options{Binary: env.qemu, Accel: c.accel}
			model := c.model
			if c.accel == spec.AccelKVM {
				if ok, why := env.caps.KVM.Starts(); !ok {
					t.Skipf("KVM: %s", why)
				}
				var err error
				if model, o.CPUFeaturesOff, err = env.caps.CPU(spec.AccelKVM, ""); err != nil {
					t.Skipf("under this host's KVM: %v", err)
				}
				o.CPU = model
			}
			vm := physBitsVM(t, c.machine, c.memory, c.accel, c.model)
			bits := GuestPhysBits(c.accel, model, host.PhysBits)
			amd := AMDModel(c.accel, model, host.AMD)
			fit := MaxMemoryFor(vm, bits, amd)
			sizes := []uint64{fit, fit + uint64(spec.GiB)}
			if bits == DefaultPhysBits {
				sizes = append(sizes, 1<<40, 1<<50)
			}
			for _, size := range sizes {
				vm.MaxMemory = spec.Size(size)
				why := PhysBitsError(vm, bits, amd, "-cpu "+model)
				refusal := physBitsRun(t, vm, o)
				t.Logf("-cpu %s (%d bits, amd %v) max_memory %s: vmsup %q, QEMU %q", model, bits, amd, vm.MaxMemory, why, refusal)
				if (why == "") != (refusal == "") {
					t.Fatalf("max_memory %s: vmsup says %q, QEMU %q", vm.MaxMemory, why, refusal)
				}
				if refusal == "" {
					continue
				}
				top := HighestGuestAddress(vm, amd)
				if want := fmt.Sprintf("< %#x phys-bits too low (%d)", top, bits); !strings.Contains(refusal, want) {
					t.Errorf("max_memory %s: QEMU says %q, want the top and bits vmsup names: %q", vm.MaxMemory, refusal, want)
				}
			}
		})
	}
}

// physBitsVM is a VM with memory hotplug on the given machine and CPU,
// booting a kernel image QEMU loads but never runs (-S).
func physBitsVM(t *testing.T, machine, memory string, accel spec.Accel, model string) *spec.VM {
	t.Helper()
	kernel := filepath.Join(t.TempDir(), "bzImage")
	if err := os.WriteFile(kernel, fakeBzImage(), 0o644); err != nil {
		t.Fatal(err)
	}
	text := "name = 'physbits'\nmemory = '" + memory + "'\nmax_memory = '64G'\naccel = '" + string(accel) + "'\nmachine = '" + machine + "'\n"
	if model != "" {
		text += "cpu_model = " + strconv.Quote(model) + "\n"
	}
	text += "[boot]\nkernel = " + strconv.Quote(kernel) + "\n"
	f, err := spec.Parse("/physbits.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return &f.VM
}

// physBitsLine is QEMU 7.2's refusal (hw/i386/pc.c).
var physBitsLine = regexp.MustCompile(`Address space limit \S+ < \S+ phys-bits too low \(\d+\)`)

// physBitsRun starts vm's argv stopped and returns QEMU's phys-bits
// refusal, "" when it started (then it quits it).
func physBitsRun(t *testing.T, vm *spec.VM, o Options) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	o.QMPSocket, o.EventSocket, o.ConsoleSocket, o.AgentSocket = filepath.Join(dir, "qmp"), filepath.Join(dir, "ev"), filepath.Join(dir, "con"), filepath.Join(dir, "ga")
	argv, err := Build(vm, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	p := launchQEMU(t, argv, "-S")
	// QEMU listens on its QMP socket before it lays out the machine, so
	// a refusal may come after the connection: QMP then fails.
	q, err := dialQMP(ctx, o.QMPSocket, p.exited)
	if err == nil {
		defer q.Close()
		if err = q.run("qmp_capabilities", nil, nil); err == nil {
			p.quit(ctx, q)
			return ""
		}
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		p.fail("QEMU neither answered QMP nor exited: %v", err)
	}
	if line := physBitsLine.FindString(p.out.String()); line != "" {
		return line
	}
	p.fail("QEMU exited (%v) without a phys-bits refusal (QMP: %v)", p.waitErr, err)
	return ""
}
