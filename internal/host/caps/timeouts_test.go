package caps

import (
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// TestTimeouts: the waits for a new QEMU grow under TCG and with the
// host's load, bounded; a [health] timeout the file sets is kept as it is.
func TestTimeouts(t *testing.T) {
	if got := ConfirmTimeout(spec.AccelKVM, 1); got != 10*time.Second {
		t.Errorf("confirm, idle KVM: %s", got)
	}
	if got := ConfirmTimeout(spec.AccelTCG, 2); got != 60*time.Second {
		t.Errorf("confirm, TCG at load 2: %s", got)
	}
	if got := HealthTimeout(0, spec.AccelKVM, 1); got != spec.DefaultHealthTimeout {
		t.Errorf("health, idle KVM: %s", got)
	}
	if got := HealthTimeout(0, spec.AccelTCG, 1); got != spec.DefaultTCGHealthTimeout || got < 5*time.Minute {
		t.Errorf("health, idle TCG: %s (a Debian guest boots in minutes under TCG)", got)
	}
	if got := HealthTimeout(0, spec.AccelTCG, 10); got != maxLoadFactor*spec.DefaultTCGHealthTimeout || got > spec.MaxHealthTimeout {
		t.Errorf("health, TCG at load 10 (stretched at most %vx): %s", maxLoadFactor, got)
	}
	if got := HealthTimeout(90*time.Second, spec.AccelTCG, 4); got != 90*time.Second {
		t.Errorf("health set by the file: %s", got)
	}
}
