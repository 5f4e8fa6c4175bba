package supervisor

import (
	"context"
	"fmt"

	"github.com/vmsup/vmsup/internal/hostcaps"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// Host facts the start path depends on, derived from the host probe
// (HostCaps). Tests and embedders may pass their own through Options.Host;
// the probe then does not run.
type Host = hostcaps.Host

// HostCaps is what this host's QEMU and KVM can run, as the host probe
// found (see internal/hostcaps).
type HostCaps = hostcaps.Caps

// HostFact is one yes/no fact of HostCaps, with what was found or why not.
type HostFact = hostcaps.Fact

// ProbeHost reads the host facts from /proc, /sys and /dev, without asking
// QEMU (Supervisor.HostCaps does).
func ProbeHost() Host { return hostcaps.ProbeHost() }

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
	c, err := s.HostCaps(context.Background(), false)
	if err != nil {
		return Host{MemTotal: hostcaps.MemTotal(), KVMUnusable: err.Error(), AppArmorUnusable: err.Error()}
	}
	return c.Host()
}

// cpuChoice is the CPU model and masks a VM runs with under accel.
type cpuChoice struct {
	Model string
	Masks []string
}

// resolveHost turns the spec's accelerator and CPU model into what this
// host runs: from the probe, or from Options.Host (no probe: no masks).
func (s *Supervisor) resolveHost(f *spec.File) (spec.Accel, string, cpuChoice, error) {
	if s.opts.Host != nil && s.opts.HostCaps == nil {
		a, why, err := s.opts.Host.Accel(f)
		return a, why, cpuChoice{}, err
	}
	c, err := s.HostCaps(context.Background(), false)
	if err != nil {
		return "", "", cpuChoice{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	r, err := c.Resolve(f)
	if d := f.VM.Display; err == nil && d.HasVideo() {
		err = c.CheckDevice(f, "display.video", d.Video, qemuargs.VideoDriver(d.Video))
	}
	return r.Accel, r.Why, cpuChoice{r.Model, r.Masks}, err
}

// checkHost checks what the spec refers to on this host (hostcaps.CheckSpec).
func checkHost(f *spec.File, h Host, qemu string) error {
	return hostcaps.CheckSpec(f, h.MemTotal, qemu)
}
