package libvirtimport

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// guestMachine is what a guest sees of its machine: the parts whose
// defaults differ between libvirt and vmsup.
type guestMachine struct {
	CPUModel                string // "" for host-passthrough (host or max)
	CPUFeatures             int    // feature settings beyond the model
	Sockets, Cores, Threads int
	ACPI                    bool
	USB                     bool
	NICROMs                 int  // NICs with an option ROM
	Prealloc                bool // every page of guest memory touched at start
}

// aspect is one part of guestMachine with the elements whose lines name
// its change: exactly these, so a line on another part of <cpu> (its
// features, say) cannot excuse a lost model.
type aspect struct {
	name          string
	elements      []string
	libvirt, argv any
}

func (m guestMachine) aspects(a guestMachine) []aspect {
	return []aspect{
		{"CPU model", []string{"cpu/@mode", "cpu/model"}, m.CPUModel, a.CPUModel},
		{"CPU features", []string{"cpu/feature"}, m.CPUFeatures, a.CPUFeatures},
		{"topology", []string{"cpu/topology"}, [3]int{m.Sockets, m.Cores, m.Threads}, [3]int{a.Sockets, a.Cores, a.Threads}},
		{"ACPI", []string{"features/acpi"}, m.ACPI, a.ACPI},
		{"USB", []string{"devices/controller (usb)"}, m.USB, a.USB},
		{"NIC ROMs", []string{"devices/interface/rom"}, m.NICROMs, a.NICROMs},
		{"memory prealloc", []string{preallocElement, "memoryBacking/allocation"}, m.Prealloc, a.Prealloc},
	}
}

// TestGuestMachine renders every imported golden (import -> VM file ->
// argv) and compares the machine the argv gives the guest with the one
// the domain XML means under libvirt: each difference must be named by
// a line, so a default that differs cannot pass in silence.
func TestGuestMachine(t *testing.T) {
	var xmls []string
	for _, dir := range []string{goldenDir, netGoldenDir, corpusDir, issue51Dir} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.xml"))
		xmls = append(xmls, m...)
	}
	checked := 0
	for _, x := range xmls {
		data, err := os.ReadFile(x)
		if err != nil {
			t.Fatal(err)
		}
		res, err := ConvertWith(data, filepath.Base(x), Options{ManagedNetworks: []string{"lab"}})
		if err != nil {
			continue // refused: TestCorpus checks why
		}
		f, err := spec.Parse("/import/x.toml", res.TOML)
		if err != nil {
			t.Fatalf("%s: %v", x, err)
		}
		argv, err := qemuargs.Build(&f.VM, hostOptions(&f.VM))
		if err != nil {
			t.Fatalf("%s: %v", x, err)
		}
		var dom libvirtxml.Domain
		if err := dom.Unmarshal(string(data)); err != nil {
			t.Fatal(err)
		}
		want, got := libvirtMachine(&dom), argvMachine(t, argv)
		for _, a := range want.aspects(got) {
			if fmt.Sprint(a.libvirt) != fmt.Sprint(a.argv) && !hasLine(res.Dropped, a.elements) {
				t.Errorf("%s: %s: libvirt %v, vmsup's argv %v, and no line on %s", filepath.Base(x), a.name, a.libvirt, a.argv, strings.Join(a.elements, " or "))
			}
		}
		checked++
	}
	if checked < 100 {
		t.Errorf("compared %d imported domains, want at least 100", checked)
	}
}

// hasLine reports whether a line names one of elements.
func hasLine(dropped []Dropped, elements []string) bool {
	for _, d := range dropped {
		if slices.Contains(elements, d.Element) {
			return true
		}
	}
	return false
}

// libvirtMachine is the machine libvirt gives the domain (TCG: a
// host-passthrough CPU is vmsup's max, compared as "").
func libvirtMachine(d *libvirtxml.Domain) guestMachine {
	m := guestMachine{CPUModel: LibvirtCPUModel, Sockets: 1, Cores: 1, Threads: 1}
	if d.VCPU != nil && d.VCPU.Value > 0 {
		m.Sockets = int(d.VCPU.Value) // libvirt's default: a socket each
	}
	if c := d.CPU; c != nil {
		switch {
		case c.Mode == "host-passthrough" || c.Mode == "maximum" || c.Mode == "host-model":
			m.CPUModel = ""
		case c.Model != nil:
			m.CPUModel = c.Model.Value
		}
		m.CPUFeatures = len(c.Features)
		if t := c.Topology; t != nil {
			m.Sockets, m.Cores, m.Threads = t.Sockets*max(t.Dies, 1), t.Cores, t.Threads
		}
	}
	m.ACPI = d.Features != nil && d.Features.ACPI != nil
	if mb := d.MemoryBacking; mb != nil {
		// libvirt preallocates huge pages, and all memory when asked.
		alloc := mb.MemoryAllocation
		m.Prealloc = mb.MemoryHugePages != nil || alloc != nil && alloc.Mode == "immediate"
	}
	m.USB = true
	if dv := d.Devices; dv != nil {
		for _, c := range dv.Controllers {
			if c.Type == "usb" && c.Model == "none" {
				m.USB = false
			}
		}
		for _, in := range dv.Interfaces {
			if in.ROM == nil || in.ROM.Bar != "off" && in.ROM.Enabled != "no" {
				m.NICROMs++
			}
		}
	}
	return m
}

// argvMachine reads the same from QEMU's argv.
func argvMachine(t *testing.T, argv []string) guestMachine {
	m := guestMachine{ACPI: true, Sockets: 1, Threads: 1}
	for i := 1; i < len(argv); i++ {
		opt, v := argv[i-1], argv[i]
		switch opt {
		case "-cpu":
			model, props, _ := strings.Cut(v, ",")
			if model != "max" && model != "host" {
				m.CPUModel = model
			}
			for _, p := range strings.Split(props, ",") {
				if p != "" && !strings.HasPrefix(p, "hv-") {
					m.CPUFeatures++
				}
			}
		case "-smp":
			m.Cores = smpTopology(v, &m) // QEMU's default for q35/pc 7.2: cores
		case "-machine":
			m.ACPI = !strings.Contains(v, "acpi=off")
		case "-no-acpi":
			m.ACPI = false
		case "-mem-prealloc":
			m.Prealloc = true
		case "-object":
			m.Prealloc = m.Prealloc || strings.Contains(v, `"prealloc":true`)
		case "-device":
			var dev struct {
				Driver  string  `json:"driver"`
				ROMFile *string `json:"romfile"`
			}
			if err := json.Unmarshal([]byte(v), &dev); err != nil {
				t.Fatalf("-device %s: %v", v, err)
			}
			if strings.Contains(dev.Driver, "usb") || strings.Contains(dev.Driver, "uhci") || strings.Contains(dev.Driver, "xhci") {
				m.USB = true
			}
			if strings.HasPrefix(dev.Driver, "virtio-net") || dev.Driver == "e1000e" {
				if dev.ROMFile == nil || *dev.ROMFile != "" {
					m.NICROMs++
				}
			}
		}
	}
	return m
}

// smpTopology reads -smp's sockets and threads into m and returns its
// cores: given, else all of maxcpus (QEMU 7.2's default for its
// current machines: one socket of cores).
func smpTopology(v string, m *guestMachine) int {
	kv := map[string]int{}
	for i, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(p, "=")
		if !ok && i == 0 {
			k, val = "cpus", p
		}
		kv[k], _ = strconv.Atoi(val)
	}
	maxCPUs := max(kv["maxcpus"], kv["cpus"])
	if _, ok := kv["sockets"]; !ok {
		return maxCPUs
	}
	m.Sockets, m.Threads = kv["sockets"]*max(kv["dies"], 1), kv["threads"]
	return kv["cores"]
}
