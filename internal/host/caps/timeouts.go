package caps

import (
	"time"

	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// How long vmsup waits for a new QEMU, sized to the host rather than fixed
// (issue 48: a fixed 10 s failed the first up on a slow host, and the
// restart gate's fixed 2 minutes was shorter than a Debian guest's boot
// under TCG): TCG emulates the firmware and the guest's boot several times
// slower than KVM, and a loaded host slows both again.

const (
	// confirmBase bounds the wait for a new QEMU to answer QMP on an idle
	// KVM host (it answers in well under a second).
	confirmBase = 10 * time.Second
	// tcgFactor is how much longer a start under TCG may take.
	tcgFactor = 3
	// probeWait bounds a probe on an idle host: ~1 s on KVM hardware,
	// 13 s in a Debian host VM under TCG (issue 48's real-host test).
	probeWait = 60 * time.Second
	// maxLoadFactor caps the load's stretch.
	maxLoadFactor = qmp.MaxLoadFactor
)

// LoadFactor is how much the host's load stretches a start
// (qmp.LoadFactor: its one-minute load average per CPU, 1 to 4).
func LoadFactor() float64 { return qmp.LoadFactor() }

// ConfirmTimeout bounds the wait for a new QEMU to answer QMP and run,
// under accel (auto counts as TCG: it may be) on a host loaded by load
// (LoadFactor).
func ConfirmTimeout(accel spec.Accel, load float64) time.Duration {
	return stretch(confirmBase, accel, load)
}

// HealthTimeout bounds a restart's health gate: set, the file's
// [health] timeout, when it gives one; else the default for accel
// (spec.DefaultHealthTimeout under KVM, spec.DefaultTCGHealthTimeout
// otherwise) stretched by the host's load, at most spec.MaxHealthTimeout.
func HealthTimeout(set time.Duration, accel spec.Accel, load float64) time.Duration {
	if set > 0 {
		return set
	}
	base := spec.DefaultHealthTimeout
	if accel != spec.AccelKVM {
		base = spec.DefaultTCGHealthTimeout
	}
	return min(time.Duration(float64(base)*clampLoad(load)), spec.MaxHealthTimeout)
}

func stretch(d time.Duration, accel spec.Accel, load float64) time.Duration {
	if accel != spec.AccelKVM {
		d *= tcgFactor
	}
	return time.Duration(float64(d) * clampLoad(load))
}

func clampLoad(load float64) float64 { return min(max(load, 1), maxLoadFactor) }
