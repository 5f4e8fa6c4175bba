package caps

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"golang.org/x/sys/unix"
)

// probeVersion changes whenever what a record holds, or how it is found,
// changes: older cached records are then probed again.
const probeVersion = 3

// fallbackModel is tried under KVM when neither host nor max start: a
// baseline CPU every x86 KVM runs.
const fallbackModel = "qemu64"

// Options configure Probe. Zero values have the documented defaults.
type Options struct {
	QEMU      string // default /usr/bin/qemu-system-x86_64
	KVMDevice string // default /dev/kvm
	// CacheFile holds the last record; "" means no cache.
	CacheFile string
	// Refresh probes even if the cache is valid.
	Refresh bool
	// Root is where /sys, /proc and /dev are read for the facts (tests
	// give a fake tree); default "/".
	Root string
	// Timeout bounds the whole probe; default probeWait stretched by the
	// host's load (LoadFactor).
	Timeout time.Duration

	// kvmDevice replaces the /dev/kvm check in tests.
	kvmDevice func(string) (desc string, opens bool, why string)
}

func (o Options) withDefaults() Options {
	if o.QEMU == "" {
		o.QEMU = "/usr/bin/qemu-system-x86_64"
	}
	if o.KVMDevice == "" {
		o.KVMDevice = "/dev/kvm"
	}
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Duration(float64(probeWait) * LoadFactor())
	}
	return o
}

// Probe returns the record for this host, from the cache when its key
// still matches, else by probing (and caching the result). It fails only
// when QEMU cannot be run at all; what QEMU or KVM cannot do is in the
// record, with reasons.
func Probe(ctx context.Context, o Options) (*Caps, error) {
	o = o.withDefaults()
	t0 := time.Now()
	root := fsys(o.Root)
	key, opens, why, err := makeKey(o, root)
	if err != nil {
		return nil, err
	}
	if !o.Refresh && o.CacheFile != "" {
		if c, err := readCache(o.CacheFile, key); err == nil {
			c.Cached, c.LoadCost = true, time.Since(t0)
			return c, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	c := &Caps{Key: key, ProbedAt: time.Now().UTC()}
	c.KVM.Kind, c.KVM.Reason = kvmKind(root, opens, why, key.KVMModule)
	var qerr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.QEMU, qerr = probeQEMU(ctx, key.QEMU)
	}()
	if opens {
		c.KVM.Modes = probeKVM(ctx, key.QEMU)
	}
	wg.Wait()
	if qerr != nil {
		return nil, fmt.Errorf("probe %s: %w", key.QEMU, qerr)
	}
	c.Facts = probeFacts(root, c.QEMU)
	c.ProbeCost = time.Since(t0)
	if c.KVM.timedOut() || ctx.Err() != nil {
		// Not an answer (the autostart at boot probed before /dev/kvm was
		// ready, and "KVM does not start" stayed cached until --refresh):
		// used for this command only, probed again by the next.
		c.KVM.Reason = strings.TrimPrefix(c.KVM.Reason+"; the KVM probe timed out (not cached: the next command probes again)", "; ")
		return c, nil
	}
	if o.CacheFile != "" {
		if err := writeCache(o.CacheFile, c); err != nil {
			return c, fmt.Errorf("cache host capabilities: %w", err)
		}
	}
	return c, nil
}

// Current reports whether c is still the record for the host o
// describes: the QEMU binary (its path, size and mtime), the kernel and
// /dev/kvm are those it was probed with. A vmsup that holds a record (the
// API server, a long-lived Supervisor) asks it before each use, so that a
// QEMU a package upgrade replaced under it is probed again.
func (c *Caps) Current(o Options) bool {
	o = o.withDefaults()
	key, _, _, err := makeKey(o, fsys(o.Root))
	return err == nil && key == c.Key
}

// probeKVM tries the CPU modes vmsup offers under KVM. When -cpu host does
// not start as it is, a baseline model tells whether KVM itself works; only
// then are feature masks tried (each try is a QEMU start).
func probeKVM(ctx context.Context, binary string) []CPUMode {
	features := sync.OnceValue(func() map[string]bool { return hostFeatures(ctx, binary) })
	none := func() map[string]bool { return nil }
	t0 := time.Now()
	if err := tryKVM(ctx, binary, "host", nil); err == nil {
		host := CPUMode{Model: "host", Starts: true, Cost: time.Since(t0)}
		return []CPUMode{host, probeMode(ctx, binary, "max", features, nil)}
	}
	base := probeMode(ctx, binary, fallbackModel, none, nil)
	if !base.Starts {
		why := "not tried: KVM does not start even with -cpu " + fallbackModel
		return []CPUMode{{Model: "host", Error: why}, {Model: "max", Error: why}, base}
	}
	host := probeMode(ctx, binary, "host", features, nil)
	return []CPUMode{host, probeMode(ctx, binary, "max", features, host.Masks), base}
}

// makeKey reads what a record depends on, and whether /dev/kvm opens.
func makeKey(o Options, root fsys) (Key, bool, string, error) {
	bin, err := exec.LookPath(o.QEMU)
	if err != nil {
		return Key{}, false, "", fmt.Errorf("QEMU binary %q not found (install qemu-system-x86)", o.QEMU)
	}
	if real, err := filepath.EvalSymlinks(bin); err == nil {
		bin = real
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return Key{}, false, "", err
	}
	st, err := os.Stat(bin)
	if err != nil {
		return Key{}, false, "", err
	}
	var u unix.Utsname
	_ = unix.Uname(&u)
	check := kvmDevice
	if o.kvmDevice != nil {
		check = o.kvmDevice
	}
	desc, opens, why := check(o.KVMDevice)
	return Key{
		Version: probeVersion, QEMU: bin, QEMUSize: st.Size(), QEMUMtime: st.ModTime().UnixNano(),
		Kernel: unix.ByteSliceToString(u.Release[:]), KVMDevice: desc, KVMModule: kvmModule(root),
	}, opens, why, nil
}

func readCache(path string, key Key) (*Caps, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Caps
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	if c.Key != key {
		return nil, fmt.Errorf("stale")
	}
	return &c, nil
}

func writeCache(path string, c *Caps) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", " ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o644)
}
