package machine

import (
	"cmp"
	"context"
	"fmt"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// Host facts the start path depends on, derived from the host probe
// (HostCaps). Tests and embedders may pass their own through Options.Host;
// the probe then does not run.
type Host = caps.Host

// HostCaps is what this host's QEMU and KVM can run, as the host probe
// found (see internal/host/caps).
type HostCaps = caps.Caps

// HostProbeOptions say which QEMU a host probe is of (HostCaps.Current).
type HostProbeOptions = caps.Options

// HostFact is one yes/no fact of HostCaps, with what was found or why not.
type HostFact = caps.Fact

// ProbeHost reads the host facts from /proc, /sys and /dev, without asking
// QEMU (Supervisor.HostCaps does).
func ProbeHost() Host { return caps.ProbeHost() }

// HostCaps returns the host probe's record: its own while current (the QEMU
// binary, kernel and /dev/kvm unchanged), else Options.HostCaps, else the
// cache under Root/cache, else by probing. refresh probes again.
func (s *Env) HostCaps(ctx context.Context, refresh bool) (*HostCaps, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.caps != nil && !refresh && s.caps.Current(caps.Options{QEMU: s.opts.QEMU}) {
		return s.caps, nil
	}
	if s.opts.HostCaps != nil && !refresh {
		s.caps = s.opts.HostCaps
		return s.caps, nil
	}
	c, err := caps.Probe(ctx, caps.Options{QEMU: s.opts.QEMU, Refresh: refresh, CacheFile: s.opts.HostCapsCache})
	if err != nil {
		return nil, err
	}
	s.caps = c
	return c, nil
}

// hostFacts are the Host facts: Options.Host, or what the probe says.
func (s *Env) hostFacts() Host {
	if s.opts.Host != nil {
		return *s.opts.Host
	}
	c, err := s.HostCaps(context.Background(), false)
	if err != nil {
		return Host{MemTotal: caps.MemTotal(), KVMUnusable: err.Error(), AppArmorUnusable: err.Error()}
	}
	return c.Host()
}

// CPUChoice is the CPU model and masks a VM runs with under accel.
type CPUChoice struct {
	Model string
	Masks []string
}

// resolveHost turns the spec's accelerator and CPU model into what this
// host runs: from the probe, or from Options.Host (no probe: no masks).
func (s *Env) resolveHost(f *spec.File) (spec.Accel, string, CPUChoice, error) {
	if s.opts.Host != nil && s.opts.HostCaps == nil {
		a, why, err := s.opts.Host.Accel(f)
		return a, why, CPUChoice{}, err
	}
	c, err := s.HostCaps(context.Background(), false)
	if err != nil {
		return "", "", CPUChoice{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	r, err := c.Resolve(f)
	if d := f.VM.Display; err == nil && d.HasVideo() {
		err = c.CheckDevice(f, "display.video", d.Video, qemuargs.VideoDriver(d.Video))
	}
	if err == nil {
		err = c.CheckFeatures(f)
	}
	return r.Accel, r.Why, CPUChoice{r.Model, r.Masks}, err
}

// checkHost checks what the spec refers to on this host (caps.CheckSpec).
func checkHost(f *spec.File, h Host, qemu string) error {
	return caps.CheckSpec(f, h.MemTotal, qemu)
}

// checkPhysBits refuses a max_memory the guest's vCPU cannot address:
// QEMU would stop at start with "phys-bits too low".
func checkPhysBits(f *spec.File, accel spec.Accel, cpu CPUChoice, h Host) error {
	model := cmp.Or(f.VM.CPUModel, cpu.Model, "max")
	if f.VM.CPUModel == "" && cpu.Model == "" && accel == spec.AccelKVM {
		model = "host" // as qemuargs renders it
	}
	bits := qemuargs.GuestPhysBits(accel, model, h.PhysBits)
	amd := qemuargs.AMDModel(accel, model, h.AMD)
	if h.MemTotal > 0 && int64(f.VM.Memory) > h.MemTotal {
		return nil // more than the host's RAM: checkHost names that
	}
	field := "max_memory"
	if f.VM.MaxMemory <= f.VM.Memory {
		field = "memory" // no hotplug region: the RAM alone is too high
	}
	if why := qemuargs.PhysBitsError(&f.VM, bits, amd, fmt.Sprintf("-cpu %s under %s", model, accel)); why != "" {
		return f.Errorf(field, "%s", why)
	}
	return nil
}

// CPRTransfer says whether this host's QEMU can take a running guest's RAM
// over in place (cpr-transfer, from the host probe), or why not.
func (s *Env) CPRTransfer(ctx context.Context) (bool, string) {
	if s.opts.Host != nil && s.opts.HostCaps == nil {
		return false, "this vmsup was given host facts without a QEMU probe"
	}
	c, err := s.HostCaps(ctx, false)
	if err != nil {
		return false, err.Error()
	}
	return c.CPRTransfer()
}
