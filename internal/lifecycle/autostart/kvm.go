package autostart

import (
	"context"
	"os"
	"strings"
	"time"
)

// At boot the kvm module is loaded by udev's coldplug (or
// systemd-modules-load), which may finish after the boot unit started: a
// VM brought up then ran under TCG, and the probe cached it (issue 48).
// The boot unit is ordered after systemd-modules-load.service, and
// autostart waits, bounded, for /dev/kvm on a host whose CPU can run KVM.
// Not a Wants=dev-kvm.device: udev does not tag /dev/kvm for systemd, so
// that device unit may never appear, and each boot would wait out its
// job timeout.

// kvmWait bounds the wait for /dev/kvm.
const kvmWait = 60 * time.Second

// kvmHost is where autostart looks for KVM (tests give a fake one).
type kvmHost struct {
	Device  string // /dev/kvm
	CPUInfo string // /proc/cpuinfo
	Wait    time.Duration
}

func (k kvmHost) withDefaults() kvmHost {
	if k.Device == "" {
		k.Device = "/dev/kvm"
	}
	if k.CPUInfo == "" {
		k.CPUInfo = "/proc/cpuinfo"
	}
	if k.Wait <= 0 {
		k.Wait = kvmWait
	}
	return k
}

// waitKVM waits for the KVM device while the CPU has virtualization (vmx,
// svm) and it is missing; it says what it found ("" when there was
// nothing to wait for).
func (k kvmHost) waitKVM(ctx context.Context) string {
	k = k.withDefaults()
	if _, err := os.Stat(k.Device); err == nil || !virtCPU(k.CPUInfo) {
		return ""
	}
	t0 := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for time.Since(t0) < k.Wait {
		select {
		case <-ctx.Done():
			return ""
		case <-tick.C:
		}
		if _, err := os.Stat(k.Device); err == nil {
			return k.Device + " appeared after " + time.Since(t0).Round(time.Millisecond).String()
		}
	}
	return k.Device + " did not appear within " + k.Wait.String() + ": VMs with accel \"auto\" start under TCG"
}

// virtCPU: the CPU flags name vmx or svm.
func virtCPU(cpuinfo string) bool {
	b, err := os.ReadFile(cpuinfo)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		for _, f := range strings.Fields(v) {
			if f == "vmx" || f == "svm" {
				return true
			}
		}
		return false
	}
	return false
}
