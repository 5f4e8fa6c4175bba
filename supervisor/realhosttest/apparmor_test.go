package realhosttest

import (
	"context"
	"strings"
	"testing"
	"time"
)

const profile = "vmsup-" + inner

// testEnforce: the demo's QEMU runs under its own profile in enforce mode,
// as vmsup status, aa-status, /proc and the kernel's log say.
func testEnforce(t *testing.T, ctx context.Context, h *hostVM) {
	st := h.sh(t, ctx, "vmsup status "+inner+" | grep '^confined:'", 2*time.Minute)
	t.Logf("vmsup status: %s", st)
	if !strings.Contains(st, profile+" (enforce)") {
		t.Errorf("vmsup status does not show %s in enforce mode: %s", profile, st)
	}
	aa := h.sh(t, ctx, "aa-status", time.Minute)
	t.Logf("aa-status:\n%s", aa)
	if !enforced(aa, profile) {
		t.Errorf("aa-status lists no %s among the profiles or processes in enforce mode", profile)
	}
	attr := h.sh(t, ctx, "cat /proc/$(systemctl show -P MainPID vmsup-"+inner+".service)/attr/current", time.Minute)
	t.Logf("the demo's QEMU runs under: %s", attr)
	if attr != profile+" (enforce)" {
		t.Errorf("QEMU's AppArmor label is %q, want %q", attr, profile+" (enforce)")
	}
	// The loader is the subject of a load's record: the profile is its name=.
	klog := h.sh(t, ctx, "journalctl -k -o cat --no-pager | grep 'apparmor=\"STATUS\"' | grep 'name=\""+profile+"\"' | tail -n 5", time.Minute)
	t.Logf("kernel log (profile load):\n%s", klog)
	if !strings.Contains(klog, `operation="profile_load"`) && !strings.Contains(klog, `operation="profile_replace"`) {
		t.Errorf("the kernel's log has no load of %s", profile)
	}
}

// enforced says whether aa-status lists name in one of its "in enforce
// mode" sections.
func enforced(aa, name string) bool {
	in := false
	for _, line := range strings.Split(aa, "\n") {
		switch {
		case strings.Contains(line, "in enforce mode"):
			in = true
		case strings.Contains(line, "mode.") || strings.Contains(line, "mode:"):
			in = false
		case in && strings.Contains(line, name):
			return true
		}
	}
	return false
}

// testDenial: the demo's profile denies what it must, for real: neither
// QEMU nor cat under it (aa-exec: the profile applies from the exec on)
// can open /etc/shadow, which root reads otherwise; the kernel logs both
// as DENIED.
func testDenial(t *testing.T, ctx context.Context, h *hostVM) {
	qemu, code, err := h.run(ctx, "aa-exec -p "+profile+" -- /usr/bin/qemu-system-x86_64 -machine none -nodefaults -display none "+
		"-blockdev driver=file,filename=/etc/shadow,node-name=x,read-only=on", time.Minute)
	t.Logf("QEMU under %s opening /etc/shadow: exit %d %v: %s", profile, code, err, qemu)
	if err != nil || code == 0 || !strings.Contains(qemu, "Permission denied") {
		t.Errorf("QEMU under %s opened /etc/shadow (exit %d, %v): %s", profile, code, err, qemu)
	}
	cat, code, err := h.run(ctx, "aa-exec -p "+profile+" -- cat /etc/shadow", time.Minute)
	t.Logf("cat under %s: exit %d %v: %s", profile, code, err, cat)
	if err != nil || code == 0 {
		t.Errorf("cat /etc/shadow under %s succeeded (%v)", profile, err)
	}
	denied := h.sh(t, ctx, "journalctl -k -o cat --no-pager | grep 'apparmor=\"DENIED\"' | grep 'profile=\""+profile+"\"' | tail -n 8", time.Minute)
	t.Logf("kernel log (denials):\n%s", denied)
	for _, comm := range []string{"qemu-system-x86", "cat"} {
		if !strings.Contains(denied, `name="/etc/shadow" pid=`) || !strings.Contains(denied, `comm="`+comm+`"`) {
			t.Errorf("the kernel logged no DENIED open of /etc/shadow by %s under %s", comm, profile)
		}
	}
}
