package realhosttest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// testRemoveKeepsVM: dpkg -r leaves the running demo running (same QEMU,
// still answering on its monitor), then the package goes back on.
func testRemoveKeepsVM(t *testing.T, ctx context.Context, h *hostVM) {
	unit := "vmsup-" + inner + ".service"
	before := h.sh(t, ctx, "systemctl show -P MainPID "+unit, time.Minute)
	out := h.sh(t, ctx, "dpkg -r vmsup", 5*time.Minute)
	t.Logf("dpkg -r:\n%s", out)
	after := h.sh(t, ctx, "systemctl is-active "+unit+"; systemctl show -P MainPID "+unit+"; "+
		"test ! -e /usr/bin/vmsup && echo binary-gone; systemctl show -P ExecStop "+unit+" | head -c 300", time.Minute)
	t.Logf("after dpkg -r:\n%s", after)
	f := strings.Split(after, "\n")
	if len(f) < 3 || f[0] != "active" || f[1] != before || f[2] != "binary-gone" {
		t.Errorf("after dpkg -r the demo's unit is not the same running one (QEMU pid %s before):\n%s", before, after)
	}
	h.sh(t, ctx, "dpkg -i /mnt/payload/vmsup.deb", 5*time.Minute)
	if p := h.sh(t, ctx, "vmsup ping "+inner, 2*time.Minute); p == "" {
		t.Error("vmsup ping: no answer after reinstalling")
	}
	if pid := h.sh(t, ctx, "systemctl show -P MainPID "+unit, time.Minute); pid != before {
		t.Errorf("reinstalling restarted the demo: QEMU pid %s, was %s", pid, before)
	}
}

// testEnableReboot: vmsup enable, a reboot of the host VM (its agent), and
// the boot unit brings the demo up again.
func testEnableReboot(t *testing.T, ctx context.Context, h *hostVM) {
	t.Logf("vmsup enable:\n%s", h.sh(t, ctx, "vmsup enable /root/demo.toml && systemctl is-enabled vmsup.service", 2*time.Minute))
	t0 := time.Now()
	if _, err := h.sup.Reboot(ctx, hostName, supervisor.RebootAgent); err != nil {
		t.Fatalf("reboot of the host VM: %v", err)
	}
	h.waitBoot(t, ctx)
	t.Logf("host VM rebooted in %s", time.Since(t0).Round(time.Second))
	// The boot is done (waitBoot): the boot unit has run, well or not.
	if st, _, _ := h.run(ctx, "systemctl is-active vmsup.service", time.Minute); st != "active" {
		j, _, _ := h.run(ctx, "journalctl -b -u vmsup.service -o cat --no-pager | tail -n 15", time.Minute)
		t.Fatalf("vmsup.service is %q after the reboot:\n%s", st, j)
	}
	h.waitInner(t, ctx)
	out := h.sh(t, ctx, "vmsup ls; journalctl -b -u vmsup.service -o cat --no-pager | tail -n 5; "+
		"echo '-- the previous boot stopped the demo:'; journalctl -b -1 -u vmsup-"+inner+".service -o cat --no-pager | tail -n 4", 2*time.Minute)
	t.Logf("after the reboot:\n%s", out)
	if !strings.Contains(out, inner) {
		t.Errorf("vmsup ls after the reboot does not list %s", inner)
	}
	// The boot unit may run before udev loads kvm_amd (slow under TCG):
	// autostart waits for /dev/kvm, so the demo gets what it had before.
	if accel := statusField(h.sh(t, ctx, "vmsup status "+inner, 2*time.Minute), "accel"); accel != h.accel {
		t.Errorf("after the reboot the demo runs under %q; its first start had %q", accel, h.accel)
	}
}
