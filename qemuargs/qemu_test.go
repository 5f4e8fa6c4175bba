package qemuargs

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	hostcaps "github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/host/hugepages"
	"github.com/vmsup/vmsup/internal/host/vfio"
	"github.com/vmsup/vmsup/spec"
)

// qemuEnv is what the acceptance test found on the host.
type qemuEnv struct {
	qemu, qemuImg  string
	caps           *hostcaps.Caps // what this host's QEMU and KVM can run
	kernel, initrd string         // for kernel-boot goldens
}

// probeHost is the host probe, once per test binary.
var probeHost = sync.OnceValues(func() (*hostcaps.Caps, error) {
	return hostcaps.Probe(context.Background(), hostcaps.Options{QEMU: testQEMU()})
})

// testQEMU is the QEMU the tests run: VMSUP_TEST_QEMU (a stand-in, see
// scripts/testing) or the installed one.
func testQEMU() string {
	if q := os.Getenv("VMSUP_TEST_QEMU"); q != "" {
		return q
	}
	q, _ := exec.LookPath("qemu-system-x86_64")
	return q
}

// TestGoldenArgsStartInQEMU starts QEMU (stopped, -S) with every golden argv,
// paths moved into a temp dir whose name has a comma (so escaping is tested
// against the real parser), and checks over QMP that every device, block
// node and chardev exists where the argv put it.
func TestGoldenArgsStartInQEMU(t *testing.T) {
	env := needQEMU(t)
	env.kernel, env.initrd = findKernel(t)

	sem := make(chan struct{}, 2) // at most two QEMUs at a time
	for _, c := range loadCases(t, goldenDir) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			startInQEMU(t, c, env)
		})
	}
}

// needQEMU finds QEMU and qemu-img or skips the test, and probes /dev/kvm.
func needQEMU(t *testing.T) qemuEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("starts QEMU; skipped with -short")
	}
	var env qemuEnv
	var err error
	if env.qemu = testQEMU(); env.qemu == "" {
		t.Skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
	}
	if env.qemuImg, err = exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img is not installed (apt-get install qemu-utils)")
	}
	if env.caps, err = probeHost(); err != nil {
		t.Fatalf("host probe: %v", err)
	}
	if ok, why := env.caps.KVM.Starts(); !ok {
		t.Logf("KVM goldens run under TCG: %s", why)
	}
	return env
}

// findKernel returns a kernel and initrd for the kernel-boot goldens: the
// test guest if configured or built (scripts/build-guest.sh), else the host's
// /boot/vmlinuz-*, else a synthetic image with a valid Linux boot-protocol
// header. With -S QEMU loads but never runs the kernel, so the synthetic one
// tests the argv just as well; it only cannot boot.
func findKernel(t *testing.T) (kernel, initrd string) {
	if k := os.Getenv("VMSUP_TEST_GUEST_KERNEL"); k != "" {
		t.Logf("kernel from VMSUP_TEST_GUEST_KERNEL: %s", k)
		return k, os.Getenv("VMSUP_TEST_GUEST_INITRD")
	}
	dir := "/var/cache/vmsup/guest"
	if d := os.Getenv("VMSUP_GUEST_DIR"); d != "" {
		dir = d
	}
	if k := filepath.Join(dir, "vmlinux"); exists(k) {
		t.Logf("kernel from the test guest: %s", k)
		return k, filepath.Join(dir, "initramfs.cpio.gz")
	}
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) > 0 {
		sort.Strings(ks)
		k := ks[len(ks)-1]
		t.Logf("kernel from the host: %s", k)
		return k, strings.Replace(k, "/boot/vmlinuz-", "/boot/initrd.img-", 1)
	}
	t.Logf("no guest kernel (set VMSUP_TEST_GUEST_KERNEL or run scripts/build-guest.sh): using a synthetic bzImage header")
	return "", ""
}

// fakeBzImage is 64 KiB with a Linux x86 boot protocol 2.15 header: enough for
// QEMU's loader, never run.
func fakeBzImage() []byte {
	b := make([]byte, 64<<10)
	b[0x1f1] = 4                                         // setup_sects
	binary.LittleEndian.PutUint16(b[0x1fe:], 0xaa55)     // boot_flag
	copy(b[0x202:], "HdrS")                              // header magic
	binary.LittleEndian.PutUint16(b[0x206:], 0x020f)     // protocol version
	b[0x211] = 0x01                                      // loadflags: LOADED_HIGH
	binary.LittleEndian.PutUint32(b[0x22c:], 0x7fffffff) // initrd_addr_max
	binary.LittleEndian.PutUint32(b[0x238:], 2047)       // cmdline_size
	return b
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// directIOWorks reports whether dir's file system takes O_DIRECT (tmpfs does
// not), which cache "none" and "directsync" need.
func directIOWorks(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, ".odirect"), os.O_CREATE|os.O_RDWR|syscall.O_DIRECT, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

func startInQEMU(t *testing.T, c goldenCase, env qemuEnv) {
	argv, o := materialize(t, c, env, false)
	checkInQEMU(t, argv, o)
}

// materialize builds the case's argv with its files created in a temp dir
// whose name has a comma and its sockets there too. Unless forceTCG, the argv
// must equal the golden one once the paths are mapped back.
func materialize(t *testing.T, c goldenCase, env qemuEnv, forceTCG bool) ([]string, Options) {
	f, err := c.parse()
	if err != nil {
		t.Fatalf("spec.Parse: %v", err)
	}
	vm := &f.VM
	o := c.options(t, vm)
	run := "/run/vmsup/" + vm.Name + "/"
	skipCPR(t, vm, o, env)

	tmp, err := os.MkdirTemp("", "qemuargs,")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	g, s := tmp+"/g/", tmp+"/s/"
	for _, d := range []string{g, s} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// Move the VM's files and sockets into tmp and create them.
	move := func(p string) string {
		if !strings.HasPrefix(p, "/golden/") {
			t.Fatalf("%s: path %q is outside /golden/: use relative paths in golden files", c.file, p)
		}
		np := g + strings.TrimPrefix(p, "/golden/")
		if err := os.MkdirAll(filepath.Dir(np), 0o755); err != nil {
			t.Fatal(err)
		}
		return np
	}
	for _, n := range vm.NICs {
		if o.VhostNet && !exists("/dev/vhost-net") {
			t.Skipf("nic %q: vhost-net needs /dev/vhost-net, which this host does not have (QEMU would abort)", n.Name)
		}
	}
	if len(vm.HostDevs) > 0 {
		why := "the golden's addresses are not this host's devices"
		if err := (vfio.Host{}).Available(); err != nil {
			why = err.Error()
		}
		t.Skipf("hostdev %s needs a host PCI device bound to vfio-pci, and %s; internal/host/vfio's tests check the host side against a fake sysfs", vm.HostDevs[0].Address, why)
	}
	for _, d := range vm.Disks {
		if len(d.IOThreadMap) > 0 && !env.caps.IOThreadVQMapping() {
			t.Skipf("disk %q: iothread_map needs QEMU 9 (iothread-vq-mapping); QEMU here is %s (the QEMU 10 pass starts it)", d.Name, env.caps.QEMU.Version)
		}
	}
	if vm.Vsock.On() && !env.caps.Facts.VhostVsock.OK {
		// QEMU's vhost-vsock-pci opens it at start; TestGoldenArgs checks the argv.
		t.Skipf("vsock: %s", env.caps.Facts.VhostVsock.Reason)
	}
	if vm.SEV != nil {
		// QEMU refuses sev-guest where KVM cannot encrypt: TestGoldenArgs
		// checks the argv, hostcaps' TestSEV the refusal.
		if why := hostcaps.SEVReason(); why != "" {
			t.Skipf("sev: %s", why)
		}
	}
	hugeMoved := false // the host's hugetlbfs is not the golden's path
	if vm.Hugepages != "" {
		// QEMU maps the guest's memory on free pages of a hugetlbfs mount:
		// the host's administrator reserves and mounts them.
		mount, err := hugepages.Host{}.Check(vm)
		if err != nil {
			t.Skipf("hugepages: %v", err)
		}
		hugeMoved, o.Hugetlbfs = mount != o.Hugetlbfs, mount
	}
	for i := range vm.Disks {
		d := &vm.Disks[i]
		switch d.Type {
		case spec.DiskBlock, spec.DiskISCSI, spec.DiskRBD:
			t.Skipf("disk %q of type %s needs a live device or target; the supervisor tests start it", d.Name, d.Type)
		case spec.DiskSeed:
			h := o.Disks[d.Name]
			h.Image = strings.Replace(h.Image, run, s, 1)
			o.Disks[d.Name] = h
			if err := os.WriteFile(h.Image, make([]byte, 1<<20), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if d.Backing != "" {
			d.Backing = move(d.Backing)
			if out, err := exec.Command(env.qemuImg, "create", "-q", "-f", "qcow2", d.Backing, "64M").CombinedOutput(); err != nil {
				t.Fatalf("qemu-img create %s: %v\n%s", d.Backing, err, out)
			}
			d.File = move(d.File)
			if out, err := exec.Command(env.qemuImg, "create", "-q", "-f", "qcow2", "-b", d.Backing, "-F", "qcow2", d.File).CombinedOutput(); err != nil {
				t.Fatalf("qemu-img create %s: %v\n%s", d.File, err, out)
			}
			continue
		}
		if (d.Cache == "none" || d.Cache == "directsync") && !directIOWorks(g) {
			t.Skipf("cache %q needs O_DIRECT, which the file system of %s does not support", d.Cache, tmp)
		}
		d.File = move(d.File)
		if d.Format == spec.FormatQcow2 {
			if out, err := exec.Command(env.qemuImg, "create", "-q", "-f", "qcow2", d.File, "64M").CombinedOutput(); err != nil {
				t.Fatalf("qemu-img create %s: %v\n%s", d.File, err, out)
			}
		} else if err := os.WriteFile(d.File, nil, 0o644); err != nil || os.Truncate(d.File, 64<<20) != nil {
			t.Fatalf("create %s: %v", d.File, err)
		}
	}
	if b := &vm.Boot; b.Kernel != "" {
		b.Kernel = move(b.Kernel)
		if env.kernel != "" {
			err = os.Symlink(env.kernel, b.Kernel)
		} else {
			err = os.WriteFile(b.Kernel, fakeBzImage(), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		if b.Initrd != "" {
			b.Initrd = move(b.Initrd)
			if exists(env.initrd) {
				err = os.Symlink(env.initrd, b.Initrd)
			} else {
				err = os.WriteFile(b.Initrd, []byte("not a real initrd\n"), 0o644)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if vm.HasVirtioFS() {
		// QEMU connects to virtiofsd's socket at start; TestGoldenArgs checks the argv.
		if _, err := hostcaps.VirtioFSD(); err != nil {
			t.Skipf("virtiofs: %v", err)
		}
		t.Skip("virtiofs: the supervisor starts virtiofsd; this test does not")
	}
	for i := range vm.Shares { // a folder of the test's own
		vm.Shares[i].Path = move(vm.Shares[i].Path)
		if err := os.MkdirAll(vm.Shares[i].Path, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if vm.TPM != nil {
		o.TPMSocket = testenv.StartSwtpm(t, s+"tpm")
	}
	for name, p := range o.Credentials { // what the supervisor writes
		np := strings.Replace(p, run, s, 1)
		if err := os.MkdirAll(filepath.Dir(np), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(np, []byte(spec.CredentialPrefix+name+"="+vm.Credentials[name]), 0o600); err != nil {
			t.Fatal(err)
		}
		o.Credentials[name] = np
	}
	for _, p := range []*string{&o.QMPSocket, &o.EventSocket, &o.ConsoleSocket, &o.ConsoleLog, &o.EventLog, &o.AgentSocket, &o.FirmwareVars, &o.VNCSocket} {
		*p = strings.Replace(*p, run, s, 1)
	}
	if o.EventLog != "" { // QEMU opens both files; it creates neither
		for sfx, data := range map[string]string{".in": EventLogInput, ".out": ""} {
			if err := os.WriteFile(o.EventLog+sfx, []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if vm.Boot.Firmware == spec.FirmwareUEFI {
		vars, err := os.ReadFile("/usr/share/OVMF/OVMF_VARS_4M.fd")
		if err != nil || !exists(o.FirmwareCode) {
			t.Skipf("UEFI needs OVMF (apt-get install ovmf): %v", err)
		}
		if err := os.WriteFile(o.FirmwareVars, vars, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if vm.Boot.Firmware == spec.FirmwareQboot && !exists(o.FirmwareCode) {
		t.Skipf("qboot ROM %s is missing", o.FirmwareCode)
	}
	golden := !forceTCG && !hugeMoved // the argv must equal the golden one, paths mapped back
	kvmOK, why := env.caps.KVM.Starts()
	switch {
	case o.Accel != spec.AccelKVM:
	case forceTCG || !kvmOK:
		if vm.CPUModel == "host" {
			t.Skipf("cpu_model \"host\" needs KVM, and here %s", orDefault(why, "the guest boots under TCG"))
		}
		o.Accel, vm.Accel, golden = spec.AccelTCG, spec.AccelTCG, false
	case o.CPU == "" && len(o.CPUFeaturesOff) == 0:
		// What the supervisor would do: the probe's model and masks.
		model, masks, err := env.caps.CPU(spec.AccelKVM, vm.CPUModel)
		if err != nil {
			t.Skipf("under this host's KVM: %v", err)
		}
		if len(masks) > 0 || vm.CPUModel == "" && model != "host" {
			t.Logf("-cpu %s with %v off, as the host probe found", model, masks)
			o.CPU, o.CPUFeaturesOff, golden = model, masks, false
		}
	}
	skipHyperv(t, vm, o)
	o.Binary = env.qemu

	argv, err := Build(vm, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if golden {
		want, err := readArgs(strings.TrimSuffix(c.file, ".toml") + ".args")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, mapBack(argv, g, s, run)); diff != "" {
			t.Fatalf("argv with paths in %s differs from the golden one beyond the paths (-want +got):\n%s", tmp, diff)
		}
	}
	skipMissingDevices(t, argv, env.caps)
	return argv, o
}

// skipCPR skips a cpr-transfer destination (it opens its monitors only
// once a source sent it its state) and shared memory where this QEMU lacks
// what it needs (aux-ram-share comes with cpr-transfer).
func skipCPR(t *testing.T, vm *spec.VM, o Options, env qemuEnv) {
	if o.CPRSocket != "" {
		t.Skip("a cpr-transfer destination opens its monitors only once a source sent it its state; the supervisor's migration tests start one")
	}
	if ok, why := env.caps.CPRTransfer(); RAMOf(vm, o).Shared && !ok {
		t.Skipf("aux-ram-share (shared memory for cpr-transfer): %s", why)
	}
}

// mapBack undoes the move into the temp dir: the escaped forms first, since
// they contain the plain ones' prefixes only up to the comma.
func mapBack(argv []string, g, s, run string) []string {
	eg, _ := escapeValue(g)
	es, _ := escapeValue(s)
	r := strings.NewReplacer(eg, "/golden/", es, run, g, "/golden/", s, run)
	out := []string{"/usr/bin/qemu-system-x86_64"}
	for _, a := range argv[1:] {
		out = append(out, r.Replace(a))
	}
	return out
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
