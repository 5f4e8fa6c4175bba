package realhosttest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestRealHost boots the Debian host VM once and runs the steps in order
// (see the package doc); each logs what it saw and its time.
func TestRealHost(t *testing.T) {
	if skipAll != "" {
		t.Skip(skipAll)
	}
	ctx := supervisortest.Context(t, 60*time.Minute)
	h := bootHost(t, ctx)
	steps := []struct {
		name string
		run  func(*testing.T, context.Context, *hostVM)
	}{
		{"host-facts", testFacts},
		{"dpkg-install", testInstall},
		{"vmsup-host", func(t *testing.T, ctx context.Context, h *hostVM) {
			t.Logf("vmsup host:\n%s", h.sh(t, ctx, "vmsup host", 5*time.Minute))
		}},
		{"demo-up", testDemoUp},
		{"apparmor-enforce", testEnforce},
		{"apparmor-denial", testDenial},
		{"systemd-analyze-security", func(t *testing.T, ctx context.Context, h *hostVM) {
			out := h.sh(t, ctx, "systemd-analyze security --no-pager vmsup-"+inner+".service | tail -n 1", 2*time.Minute)
			if !strings.Contains(out, "Overall exposure level for vmsup-"+inner+".service") {
				t.Errorf("systemd-analyze security: %s", out)
			}
			t.Logf("%s", out)
		}},
		{"dpkg-remove-keeps-vm", testRemoveKeepsVM},
		{"enable-reboot", testEnableReboot},
		{"down", func(t *testing.T, ctx context.Context, h *hostVM) {
			t.Logf("vmsup down:\n%s", h.sh(t, ctx, "vmsup down "+inner+" && vmsup disable "+inner, 3*time.Minute))
			if out, _, _ := h.run(ctx, "systemctl is-active vmsup-"+inner+".service", time.Minute); out == "active" {
				t.Errorf("vmsup-%s.service still active after down", inner)
			}
		}},
	}
	for _, s := range steps {
		t1 := time.Now()
		ok := t.Run(s.name, func(t *testing.T) { s.run(t, ctx, h) })
		t.Logf("%s: %s", s.name, time.Since(t1).Round(100*time.Millisecond))
		if !ok {
			break // the steps build on each other
		}
	}
	t2 := time.Now()
	if _, err := h.sup.DownWith(ctx, hostName, supervisor.DownOptions{}); err != nil {
		t.Errorf("down of the host VM: %v", err)
	}
	t.Logf("host VM down in %s", time.Since(t2).Round(100*time.Millisecond))
}

// testFacts: the host is what the package targets: systemd as PID 1,
// cgroup v2 only, AppArmor enabled; and what nesting it offers.
func testFacts(t *testing.T, ctx context.Context, h *hostVM) {
	out := h.sh(t, ctx, `echo "pid1=$(cat /proc/1/comm)"; echo "cgroupfs=$(stat -fc %T /sys/fs/cgroup)";
		echo "apparmor=$(cat /sys/module/apparmor/parameters/enabled)"; echo "lsm=$(cat /sys/kernel/security/lsm)";
		echo "kernel=$(uname -r)"; echo "cmdline=$(cat /proc/cmdline)"; echo "svm=$(grep -cw svm /proc/cpuinfo)";
		echo "kvm=$(ls -l /dev/kvm 2>&1)"; qemu-system-x86_64 --version | head -n 1; systemctl --version | head -n 1`, time.Minute)
	t.Logf("host VM:\n%s", out)
	for _, want := range []string{"pid1=systemd", "cgroupfs=cgroup2fs", "apparmor=Y", "apparmor"} {
		if !strings.Contains(out, want) {
			t.Errorf("host VM: no %q", want)
		}
	}
}

// testInstall: dpkg -i of the project's package, then the tiny guest and
// the demo's file where examples/demo.toml names them.
func testInstall(t *testing.T, ctx context.Context, h *hostVM) {
	out := h.sh(t, ctx, "mkdir -p /mnt/payload && mount -o ro /dev/disk/by-id/virtio-"+payloadSerial+" /mnt/payload && "+
		"dpkg -i /mnt/payload/vmsup.deb", 5*time.Minute)
	t.Logf("dpkg -i:\n%s", out)
	out = h.sh(t, ctx, "dpkg-query -W vmsup; vmsup --version; systemctl list-unit-files --no-pager 'vmsup*'; "+
		"getent passwd vmsup-qemu; stat -c '%a %U %n' /var/lib/vmsup", time.Minute)
	t.Logf("installed:\n%s", out)
	f := strings.Fields(out)
	if len(f) < 4 || f[0] != "vmsup" || f[2] != "vmsup" || f[3] != f[1] {
		t.Errorf("dpkg-query and vmsup --version disagree:\n%s", out)
	}
	for _, want := range []string{"vmsup-metrics.socket", "vmsup-api.socket", "vmsup.service", "vmsup-qemu:", "755 root /var/lib/vmsup"} {
		if !strings.Contains(out, want) {
			t.Errorf("after dpkg -i: no %q", want)
		}
	}
	h.sh(t, ctx, "mkdir -p /var/cache/vmsup/guest && cp /mnt/payload/guest/* /var/cache/vmsup/guest/ && "+
		"cp /mnt/payload/demo.toml /root/demo.toml", 2*time.Minute)
}

// testDemoUp: vmsup up of the demo in the host VM, to its agent's answer.
func testDemoUp(t *testing.T, ctx context.Context, h *hostVM) {
	t.Logf("vmsup up:\n%s", h.sh(t, ctx, "vmsup up /root/demo.toml", 5*time.Minute))
	h.waitInner(t, ctx)
	st := h.sh(t, ctx, "vmsup status "+inner, 2*time.Minute)
	t.Logf("vmsup status:\n%s", st)
	h.accel = statusField(st, "accel")
}

// statusField is the value of a "key: value" line of vmsup status.
func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
