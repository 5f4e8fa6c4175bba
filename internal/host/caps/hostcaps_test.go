package caps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/spec"
)

const realQEMU = "/usr/bin/qemu-system-x86_64"

func needQEMU(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(realQEMU); err != nil {
		t.Skipf("no %s: %v", realQEMU, err)
	}
}

// standinQEMU writes an executable that runs this test binary as the
// stand-in QEMU in mode.
func standinQEMU(t *testing.T, mode string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "qemu-"+strings.ReplaceAll(mode, ":", "-"))
	script := "#!/bin/sh\n" + standinEnv + "='" + mode + "' exec '" + self + "' \"$@\"\n"
	// No fork while the script is open for writing: a parallel subtest's
	// child would hold it open until its exec, and this one's exec of the
	// script would fail "text file busy".
	syscall.ForkLock.RLock()
	err = os.WriteFile(path, []byte(script), 0o755)
	syscall.ForkLock.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// fakeHost is a /proc and /sys tree of a host with module (kvm_amd,
// kvm_pvm) loaded and an svm CPU, whose /dev/kvm opens.
func fakeHost(t *testing.T, module string) (string, func(string) (string, bool, string)) {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "proc"), 0o755)
	os.WriteFile(filepath.Join(root, "proc/cpuinfo"), []byte("vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 svm\n"), 0o644)
	os.MkdirAll(filepath.Join(root, "sys/module", module), 0o755)
	return root, func(string) (string, bool, string) { return "char 10:232 0666 opens (stand-in)", true, "" }
}

func probe(t *testing.T, mode, module string) *Caps {
	t.Helper()
	needQEMU(t)
	root, dev := fakeHost(t, module)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Probe(ctx, Options{QEMU: standinQEMU(t, mode), Root: root, kvmDevice: dev})
	if err != nil {
		t.Fatalf("probe (%s): %v", mode, err)
	}
	t.Logf("%s: kvm %s %q; modes %+v; cost %s", mode, c.KVM.Kind, c.KVM.Reason, c.KVM.Modes, c.ProbeCost)
	return c
}

// TestProbeStandins: the probe's decisions against stand-in QEMUs for each
// kind of host.
func TestProbeStandins(t *testing.T) {
	t.Parallel()
	t.Run("full-kvm", func(t *testing.T) {
		t.Parallel()
		c := probe(t, "full", "kvm_amd")
		if a, why, err := c.Accel(spec.AccelAuto); a != spec.AccelKVM || err != nil {
			t.Fatalf("auto: %s %q %v", a, why, err)
		}
		if m, masks, err := c.CPU(spec.AccelKVM, ""); m != "host" || len(masks) != 0 || err != nil {
			t.Fatalf("cpu: %s %v %v", m, masks, err)
		}
	})
	t.Run("needs-mask", func(t *testing.T) {
		t.Parallel()
		c := probe(t, "mask", "kvm_amd")
		host, _ := c.KVM.Mode("host")
		if !host.Starts || strings.Join(host.Masks, ",") != "arch-capabilities" || !strings.Contains(host.Error, "failed to set MSR 0x10a") {
			t.Fatalf("host mode: %+v", host)
		}
		if a, _, err := c.Accel(spec.AccelAuto); a != spec.AccelKVM || err != nil {
			t.Fatalf("auto: %s %v", a, err)
		}
		m, masks, err := c.CPU(spec.AccelKVM, "")
		if m != "host" || strings.Join(masks, ",") != "arch-capabilities" || err != nil {
			t.Fatalf("cpu: %s %v %v", m, masks, err)
		}
		if max, _ := c.KVM.Mode("max"); !max.Starts || strings.Join(max.Masks, ",") != "arch-capabilities" {
			t.Fatalf("max mode: %+v", max)
		}
	})
	t.Run("aborts-on-host", func(t *testing.T) {
		t.Parallel()
		c := probe(t, "abort", "kvm_amd")
		if host, _ := c.KVM.Mode("host"); host.Starts {
			t.Fatalf("host starts: %+v", host)
		}
		// KVM itself works (a baseline model starts): auto still uses
		// it, with the model that starts; asking for host says what would.
		m, _, err := c.CPU(spec.AccelKVM, "")
		if err != nil || m != fallbackModel {
			t.Fatalf("default model: %q %v", m, err)
		}
		_, _, err = c.CPU(spec.AccelKVM, "host")
		if err == nil || !strings.Contains(err.Error(), "does not start under KVM here") || !strings.Contains(err.Error(), "these would: "+fallbackModel) {
			t.Fatalf("cpu host: %v", err)
		}
	})
	t.Run("kvm-absent", func(t *testing.T) {
		t.Parallel()
		needQEMU(t)
		root, _ := fakeHost(t, "kvm_amd")
		c, err := Probe(context.Background(), Options{QEMU: realQEMU, Root: root, KVMDevice: filepath.Join(root, "no-kvm")})
		if err != nil {
			t.Fatal(err)
		}
		if c.KVM.Kind != KVMNone || len(c.KVM.Modes) != 0 || !strings.Contains(c.KVM.Reason, "no ") {
			t.Fatalf("kvm: %+v", c.KVM)
		}
		if a, why, _ := c.Accel(spec.AccelAuto); a != spec.AccelTCG || !strings.Contains(why, "no ") {
			t.Fatalf("auto: %s %q", a, why)
		}
		_, _, err = c.Accel(spec.AccelKVM)
		if err == nil || !strings.Contains(err.Error(), "kvm requested but no ") || !strings.Contains(err.Error(), "accel = \"tcg\"") {
			t.Fatalf("explicit kvm: %v", err)
		}
	})
	t.Run("kvm-fails", func(t *testing.T) {
		t.Parallel()
		c := probe(t, "nokvm", "kvm_amd")
		ok, why := c.KVM.Starts()
		if ok || !strings.Contains(why, "failed to initialize kvm") {
			t.Fatalf("starts %v: %s", ok, why)
		}
		if a, reason, _ := c.Accel(spec.AccelAuto); a != spec.AccelTCG || !strings.Contains(reason, "failed to initialize kvm") {
			t.Fatalf("auto: %s %q", a, reason)
		}
	})
	t.Run("pvm", func(t *testing.T) {
		t.Parallel()
		c := probe(t, "full", "kvm_pvm")
		if c.KVM.Kind != KVMPVM {
			t.Fatalf("kind %s", c.KVM.Kind)
		}
		// auto never picks a KVM that cannot boot a stock guest; asked for
		// explicitly, QEMU starts on it.
		if a, why, _ := c.Accel(spec.AccelAuto); a != spec.AccelTCG || !strings.Contains(why, "PVM") {
			t.Fatalf("auto: %s %q", a, why)
		}
		if a, _, err := c.Accel(spec.AccelKVM); a != spec.AccelKVM || err != nil {
			t.Fatalf("explicit: %s %v", a, err)
		}
	})
	t.Run("missing-command", func(t *testing.T) {
		t.Parallel()
		c := probe(t, "missing:blockdev-add", "kvm_amd")
		err := c.Check()
		if err == nil || !strings.Contains(err.Error(), `lacks the QMP command "blockdev-add" that vmsup needs`) {
			t.Fatalf("check: %v", err)
		}
	})
}

// TestProbeMigrationModes: the real QEMU's migration modes follow its
// version: cpr-transfer from 10.0, and a reason naming the version before.
func TestProbeMigrationModes(t *testing.T) {
	t.Parallel()
	needQEMU(t)
	root, _ := fakeHost(t, "kvm_amd")
	c, err := Probe(context.Background(), Options{QEMU: realQEMU, Root: root, KVMDevice: filepath.Join(root, "no-kvm")})
	if err != nil {
		t.Fatal(err)
	}
	ok, why := c.CPRTransfer()
	major, _ := strconv.Atoi(strings.Split(c.QEMU.Version, ".")[0])
	if ok != (major >= 10) || !ok && !strings.Contains(why, c.QEMU.Version) {
		t.Fatalf("QEMU %s: cpr-transfer %v %q (modes %v)", c.QEMU.Version, ok, why, c.QEMU.MigrationModes)
	}
	t.Logf("QEMU %s: migration modes %v", c.QEMU.Version, c.QEMU.MigrationModes)
}

// TestProbeCache: a second probe reads the record; a changed QEMU binary
// (its mtime) makes a new one, and a record held before is no longer
// Current.
func TestProbeCache(t *testing.T) {
	needQEMU(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "qemu")
	os.Symlink(realQEMU, filepath.Join(dir, "link"))
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec "+realQEMU+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := Options{QEMU: bin, CacheFile: filepath.Join(dir, "cache", "host.json")}
	cold, err := Probe(context.Background(), o)
	if err != nil || cold.Cached {
		t.Fatalf("cold: %+v %v", cold, err)
	}
	warm, err := Probe(context.Background(), o)
	if err != nil || !warm.Cached || warm.ProbeCost != cold.ProbeCost {
		t.Fatalf("warm: cached %v %v", warm.Cached, err)
	}
	t.Logf("probe: cold %s, cached %s", cold.ProbeCost, warm.LoadCost)
	if !warm.Current(o) {
		t.Fatalf("the record is not current for the binary it was probed from: %+v", warm.Key)
	}
	later := time.Now().Add(time.Minute)
	os.Chtimes(bin, later, later)
	if warm.Current(o) {
		t.Fatal("the record is still current after the binary changed")
	}
	again, err := Probe(context.Background(), o)
	if err != nil || again.Cached {
		t.Fatalf("after the binary changed: cached %v %v", again.Cached, err)
	}
	if again.QEMU.Version == "" || len(again.QEMU.Models) == 0 || len(again.QEMU.Machines) == 0 || len(again.QEMU.Missing) != 0 {
		t.Fatalf("record: %+v", again.QEMU)
	}
	// The aliases vmsup lays out resolve to versioned types, and the
	// device list is QEMU's (-device help).
	for _, alias := range []string{"q35", "pc"} {
		if v := again.QEMU.Aliases[alias]; !spec.MachineVersioned(v) || spec.MachineFamily(v) != alias {
			t.Errorf("alias %s resolves to %q", alias, v)
		}
	}
	if !again.HasDevice("virtio-net-pci") || again.HasDevice("no-such-device") {
		t.Errorf("devices: %d, virtio-net-pci missing or no-such-device there", len(again.QEMU.Devices))
	}
	t.Logf("q35 = %s, pc = %s, %d devices", again.QEMU.Aliases["q35"], again.QEMU.Aliases["pc"], len(again.QEMU.Devices))
}

// TestProbeTimeoutNotCached: a KVM probe cut short by the timeout (at
// boot, before /dev/kvm was ready) is no answer: the record says so, KVM
// is not chosen, and nothing is cached, so the next command probes again
// (issue 48: "KVM does not start" stayed cached until --refresh).
func TestProbeTimeoutNotCached(t *testing.T) {
	needQEMU(t)
	root, dev := fakeHost(t, "kvm_amd")
	cache := filepath.Join(t.TempDir(), "host.json")
	o := Options{QEMU: standinQEMU(t, "hang"), Root: root, kvmDevice: dev, CacheFile: cache, Timeout: 8 * time.Second}
	c, err := Probe(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kvm %s %q; modes %+v", c.KVM.Kind, c.KVM.Reason, c.KVM.Modes)
	if ok, _ := c.KVM.Starts(); ok || !c.KVM.timedOut() || !strings.Contains(c.KVM.Reason, "timed out") {
		t.Errorf("a timed-out KVM probe: %+v", c.KVM)
	}
	if _, err := os.Stat(cache); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a timed-out probe was cached: %v", err)
	}
}

// TestCPUChoices: model choices and their errors, on a record.
func TestCPUChoices(t *testing.T) {
	c := &Caps{QEMU: QEMU{Version: "7.2.0", Models: []CPUModel{{Name: "EPYC"}, {Name: "EPYC-Rome"}, {Name: "max"}, {Name: "qemu64"}}}}
	if m, _, err := c.CPU(spec.AccelTCG, ""); m != "max" || err != nil {
		t.Fatalf("tcg default: %s %v", m, err)
	}
	if m, _, err := c.CPU(spec.AccelTCG, "EPYC"); m != "EPYC" || err != nil {
		t.Fatalf("tcg EPYC: %s %v", m, err)
	}
	_, _, err := c.CPU(spec.AccelTCG, "EPYX")
	if err == nil || !strings.Contains(err.Error(), `has no CPU model "EPYX"`) || !strings.Contains(err.Error(), "EPYC") {
		t.Fatalf("unknown model: %v", err)
	}
	if _, _, err := c.CPU(spec.AccelTCG, "host"); err == nil || !strings.Contains(err.Error(), "needs KVM") {
		t.Fatalf("host under tcg: %v", err)
	}
}

// TestKVMKeyIgnoresMode: the cache key of /dev/kvm does not change when
// its mode does (vmsup's ACL for a running VM's QEMU user shows in the
// group bits); a key that did re-probed on every command.
func TestKVMKeyIgnoresMode(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "kvm")
	if err := unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(10, kvmMinor))); err != nil {
		t.Skipf("cannot make a device node here (%v): the key's mode-independence is not shown", err)
	}
	before, _, _ := kvmDevice(dev)
	if err := os.Chmod(dev, 0o660); err != nil {
		t.Fatal(err)
	}
	if after, _, _ := kvmDevice(dev); after != before {
		t.Errorf("key %q became %q with the mode", before, after)
	}
}

// orphanEnv makes the test binary start a probe QEMU, print its pid and
// exit without ending it (TestProbeDiesWithCaller).
const orphanEnv = "VMSUP_TEST_ORPHAN_PROBE"

func orphanProbe() int {
	r, err := startQEMU(context.Background(), realQEMU, "-machine", "none", "-accel", "tcg")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(r.cmd.Process.Pid)
	return 0
}

// TestProbeDiesWithCaller: a probe's QEMU does not outlive the process
// that started it (a CLI that exits mid-probe).
func TestProbeDiesWithCaller(t *testing.T) {
	needQEMU(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), orphanEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("pid %q: %v", out, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(b), "qemu") {
			return
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("probe QEMU %d outlived its caller by 5 s", pid)
		}
	}
}
