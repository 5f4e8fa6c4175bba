package caps

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// Caps is one probe's record.
type Caps struct {
	Key      Key       `json:"key"`
	ProbedAt time.Time `json:"probed_at"`
	// ProbeCost is how long the probe that made this record took.
	ProbeCost time.Duration `json:"probe_cost_ns"`
	QEMU      QEMU          `json:"qemu"`
	KVM       KVM           `json:"kvm"`
	Facts     Facts         `json:"facts"`

	// Cached says this record was read from the cache, in LoadCost.
	Cached   bool          `json:"-"`
	LoadCost time.Duration `json:"-"`
}

// Key is what a record depends on: a change to any of it means a new probe.
type Key struct {
	Version   int    `json:"version"` // of the probe (probeVersion)
	QEMU      string `json:"qemu"`    // the binary, symlinks resolved
	QEMUSize  int64  `json:"qemu_size"`
	QEMUMtime int64  `json:"qemu_mtime_ns"`
	Kernel    string `json:"kernel"`     // uname -r
	KVMDevice string `json:"kvm_device"` // "absent", or the node's type, numbers, mode and whether it opens
	KVMModule string `json:"kvm_module"` // kvm_pvm, kvm_intel, kvm_amd, or ""
}

// QEMU is what the binary says of itself.
type QEMU struct {
	Binary   string   `json:"binary"`
	Version  string   `json:"version"` // "7.2.19"
	Package  string   `json:"package,omitempty"`
	Machines []string `json:"machines"` // names and aliases
	// Aliases maps each alias to the versioned machine type it stands for
	// in this QEMU ("q35" -> "pc-q35-7.2").
	Aliases  map[string]string `json:"machine_aliases,omitempty"`
	Default  string            `json:"default_machine,omitempty"`
	Models   []CPUModel        `json:"cpu_models"` // as TCG sees them
	Commands []string          `json:"commands"`   // QMP commands in its schema, sorted
	// Missing lists the QMP commands vmsup needs that this QEMU lacks.
	Missing []string `json:"missing,omitempty"`
	IOURing bool     `json:"io_uring"` // built with io_uring (aio = "io_uring")
	// Devices are the device types it offers (qom-list-types, modules
	// loaded: Debian's QEMU 10 has qxl only with qemu-system-modules-spice).
	Devices []string `json:"devices,omitempty"`
	// MigrationCaps are its migration capabilities (mapped-ram from 9.0).
	MigrationCaps []string `json:"migration_caps,omitempty"`
	// MigrationModes are the values of its migration parameter "mode"
	// (from 8.2: normal, cpr-reboot; cpr-transfer from 10.0).
	MigrationModes []string `json:"migration_modes,omitempty"`
}

// CPUModel is one entry of query-cpu-definitions.
type CPUModel struct {
	Name        string   `json:"name"`
	Unavailable []string `json:"unavailable,omitempty"` // features the accelerator lacks
}

// KVM kinds.
const (
	KVMNone = "none" // no usable /dev/kvm
	KVMPVM  = "pvm"  // kvm_pvm: QEMU starts, but only PVM-built guest kernels boot
	KVMFull = "full" // hardware virtualization
)

// KVM is what KVM can do here.
type KVM struct {
	Kind   string `json:"kind"`
	Reason string `json:"reason,omitempty"` // why none, or what PVM cannot do
	// Modes are the CPU modes vmsup offers, each tried under KVM (absent
	// when /dev/kvm does not open).
	Modes []CPUMode `json:"modes,omitempty"`
}

// CPUMode is one -cpu model started under KVM with -S.
type CPUMode struct {
	Model  string   `json:"model"`
	Starts bool     `json:"starts"`
	Masks  []string `json:"masks,omitempty"` // features turned off to make it start
	// Error is why it does not start (QEMU's last words), or, with Masks,
	// why it did not start without them.
	Error string        `json:"error,omitempty"`
	Cost  time.Duration `json:"cost_ns"`
	// TimedOut: a try was cut short by the probe's timeouts (a loaded or
	// still-booting host), so "does not start" is not an answer: such a
	// record is never cached.
	TimedOut bool `json:"timed_out,omitempty"`
}

// Fact is one yes/no fact with what was found or why not.
type Fact struct {
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
	Reason string `json:"reason,omitempty"` // why not
}

// Facts are the host facts besides QEMU and KVM.
type Facts struct {
	VhostNet    Fact            `json:"vhost_net"`
	VhostVsock  Fact            `json:"vhost_vsock"`
	Userfaultfd Fact            `json:"userfaultfd"` // for an unprivileged QEMU
	IOURing     Fact            `json:"io_uring"`
	AppArmor    Fact            `json:"apparmor"`
	OVSDatapath Fact            `json:"ovs_datapath"`
	Hugepages   Fact            `json:"hugepages"`
	IOMMU       Fact            `json:"iommu"`
	Helpers     map[string]Fact `json:"helpers"`
}

// timedOut: a mode's try was cut short (CPUMode.TimedOut).
func (k KVM) timedOut() bool {
	return slices.ContainsFunc(k.Modes, func(m CPUMode) bool { return m.TimedOut && !m.Starts })
}

// StartModes lists the CPU modes that start under KVM.
func (k KVM) StartModes() []CPUMode {
	var out []CPUMode
	for _, m := range k.Modes {
		if m.Starts {
			out = append(out, m)
		}
	}
	return out
}

// Starts reports whether QEMU starts under KVM here in some CPU mode (a VM
// with no guest OS runs; on PVM a stock kernel still does not boot), and
// why not.
func (k KVM) Starts() (bool, string) {
	if len(k.StartModes()) > 0 {
		return true, ""
	}
	if k.Kind == KVMNone || len(k.Modes) == 0 {
		return false, k.Reason
	}
	var why []string
	for _, m := range k.Modes {
		why = append(why, fmt.Sprintf("-cpu %s: %s", m.Model, m.Error))
	}
	return false, "QEMU does not start under KVM in any CPU mode (" + strings.Join(why, "; ") + ")"
}

// Mode returns the record of one CPU mode.
func (k KVM) Mode(model string) (CPUMode, bool) {
	i := slices.IndexFunc(k.Modes, func(m CPUMode) bool { return m.Model == model })
	if i < 0 {
		return CPUMode{}, false
	}
	return k.Modes[i], true
}

// Accel resolves the spec's accelerator. "auto" picks KVM only where it can
// boot a stock guest (full KVM that starts); an explicit "kvm" needs only
// that QEMU starts under it (PVM hosts run PVM guests). The reason says why
// auto chose TCG, or what an explicit kvm will not do.
func (c *Caps) Accel(want spec.Accel) (spec.Accel, string, error) {
	starts, why := c.KVM.Starts()
	switch want {
	case spec.AccelKVM:
		if !starts {
			return "", "", fmt.Errorf("kvm requested but %s; accel = \"tcg\" runs it emulated (slower)", why)
		}
		if c.KVM.Kind == KVMPVM {
			return spec.AccelKVM, c.KVM.Reason, nil
		}
		return spec.AccelKVM, "", nil
	case spec.AccelTCG:
		return spec.AccelTCG, "", nil
	}
	if starts && c.KVM.Kind == KVMFull {
		return spec.AccelKVM, "", nil
	}
	if why == "" {
		why = c.KVM.Reason
	}
	return spec.AccelTCG, "auto chose tcg: " + why, nil
}

// CPU resolves the CPU model for a VM under accel: the spec's model ("" for
// the default: host under KVM, max under TCG) and the features to turn off
// so that it starts here. An error says what does not work and what would.
func (c *Caps) CPU(accel spec.Accel, model string) (string, []string, error) {
	if accel == spec.AccelKVM {
		if model == "" {
			model = "host"
			if m, ok := c.KVM.Mode("host"); ok && !m.Starts {
				if alt := c.KVM.StartModes(); len(alt) > 0 {
					model = alt[0].Model
				}
			}
		}
		if m, ok := c.KVM.Mode(model); ok {
			if !m.Starts {
				return "", nil, fmt.Errorf("-cpu %s does not start under KVM here (%s)%s", model, m.Error, c.modelHint(accel, model))
			}
			return model, slices.Clone(m.Masks), nil
		}
	} else if model == "" {
		return "max", nil, nil
	}
	if model == "host" && accel != spec.AccelKVM {
		return "", nil, fmt.Errorf("cpu_model \"host\" needs KVM; under %s use \"max\" or a named model", accel)
	}
	if len(c.QEMU.Models) > 0 && !slices.ContainsFunc(c.QEMU.Models, func(m CPUModel) bool { return m.Name == model }) {
		return "", nil, fmt.Errorf("QEMU %s has no CPU model %q%s", c.QEMU.Version, model, c.modelHint(accel, model))
	}
	return model, nil, nil
}

// modelHint suggests models that would work instead of model.
func (c *Caps) modelHint(accel spec.Accel, model string) string {
	var ok []string
	if accel == spec.AccelKVM {
		for _, m := range c.KVM.StartModes() {
			ok = append(ok, m.Model)
		}
	} else {
		ok = append(ok, "max")
	}
	// Close names first (same vendor family), then a few others.
	var near []string
	for _, m := range c.QEMU.Models {
		if len(model) >= 3 && strings.HasPrefix(strings.ToLower(m.Name), strings.ToLower(model[:3])) && len(m.Unavailable) == 0 {
			near = append(near, m.Name)
		}
	}
	sort.Strings(near)
	if len(near) > 4 {
		near = near[:4]
	}
	ok = append(ok, near...)
	ok = slices.DeleteFunc(ok, func(s string) bool { return s == model })
	if len(ok) == 0 {
		return ""
	}
	return "; these would: " + strings.Join(ok, ", ")
}

// HasMigrationCap reports whether QEMU has the migration capability.
func (c *Caps) HasMigrationCap(name string) bool {
	return slices.Contains(c.QEMU.MigrationCaps, name)
}

// CPRTransfer says whether this QEMU can take over a running QEMU's
// guest in place, its RAM shared (migration mode cpr-transfer, with the
// machine option aux-ram-share: QEMU 10.0), or why not.
func (c *Caps) CPRTransfer() (bool, string) {
	if slices.Contains(c.QEMU.MigrationModes, "cpr-transfer") {
		return true, ""
	}
	return false, fmt.Sprintf("QEMU %s has no cpr-transfer migration mode (QEMU 10.0 and newer have it)", c.QEMU.Version)
}

// Check returns an error naming the first QMP command vmsup needs that this
// QEMU lacks.
func (c *Caps) Check() error {
	if len(c.QEMU.Missing) == 0 {
		return nil
	}
	return fmt.Errorf("QEMU %s (%s) lacks the QMP command %q that vmsup needs (install QEMU 7.2 or newer)",
		c.QEMU.Binary, c.QEMU.Version, c.QEMU.Missing[0])
}

// requiredCommands are the QMP commands vmsup uses.
func requiredCommands() []string {
	return []string{
		"qmp_capabilities", "query-status", "stop", "cont", "system_powerdown", "system_reset", "quit",
		"query-version", "query-kvm", "query-cpus-fast", "query-hotpluggable-cpus", "query-cpu-definitions",
		"device_add", "device_del", "blockdev-add", "blockdev-del", "query-named-block-nodes",
		"netdev_add", "netdev_del", "object-add", "object-del", "query-memory-devices",
		"query-memory-size-summary", "query-chardev", "query-pci", "add-fd", "remove-fd", "getfd",
		"migrate", "migrate-incoming", "query-migrate", "migrate-set-capabilities",
		"migrate-set-parameters", "migrate_cancel", "migrate-start-postcopy",
	}
}
