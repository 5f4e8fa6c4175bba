package autostart

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWaitKVM: on a host whose CPU can run KVM, autostart waits (bounded)
// for /dev/kvm that udev creates late at boot; without vmx/svm, or with
// the device there, it does not wait at all.
func TestWaitKVM(t *testing.T) {
	dir := t.TempDir()
	virt, plain := filepath.Join(dir, "virt"), filepath.Join(dir, "plain")
	os.WriteFile(virt, []byte("processor\t: 0\nflags\t\t: fpu sse2 vmx\n"), 0o644)
	os.WriteFile(plain, []byte("processor\t: 0\nflags\t\t: fpu sse2\n"), 0o644)
	dev := filepath.Join(dir, "kvm")
	ctx := context.Background()

	t0 := time.Now()
	if note := (kvmHost{Device: dev, CPUInfo: plain, Wait: time.Minute}).waitKVM(ctx); note != "" || time.Since(t0) > time.Second {
		t.Errorf("no vmx/svm: %q after %s", note, time.Since(t0))
	}
	if note := (kvmHost{Device: dev, CPUInfo: virt, Wait: 600 * time.Millisecond}).waitKVM(ctx); !strings.Contains(note, "did not appear") {
		t.Errorf("a device that never comes: %q", note)
	}
	go func() { time.Sleep(300 * time.Millisecond); os.WriteFile(dev, nil, 0o644) }()
	if note := (kvmHost{Device: dev, CPUInfo: virt, Wait: time.Minute}).waitKVM(ctx); !strings.Contains(note, "appeared after") {
		t.Errorf("a device that comes late: %q", note)
	}
	if note := (kvmHost{Device: dev, CPUInfo: virt}).waitKVM(ctx); note != "" {
		t.Errorf("a device that is there: %q", note)
	}
	u, err := (&Marks{o: Options{Command: []string{"/usr/bin/vmsup"}, BootTarget: "multi-user.target"}}).bootUnit().Render()
	if err != nil || !strings.Contains(string(u), "systemd-modules-load.service") {
		t.Errorf("boot unit (%v):\n%s", err, u)
	}
}
