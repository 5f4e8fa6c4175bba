package paritytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/google/uuid"
	toml "github.com/pelletier/go-toml/v2"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/host/hugepages"
	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// importDir holds the libvirt domain XMLs and the VM files vmsup import
// made of them (their goldens are checked in package libvirtimport).
const importDir = "../../testdata/import"

// TestImportedGoldens: each imported VM file passes `vmsup validate` and its
// argv starts in QEMU -S, with what it names outside itself stood in:
// images made here, the bridges in a network namespace of the test's own,
// its RBD images and iSCSI targets on this package's real cluster and tgtd
// (monitors and portals pointed there), libvirt's secret files by the
// cluster's key.
func TestImportedGoldens(t *testing.T) {
	tg := needTargets(t)
	ctx := supervisortest.Context(t, 10*time.Minute)
	files, err := filepath.Glob(filepath.Join(importDir, "*.toml"))
	if err != nil || len(files) < 20 {
		t.Fatalf("want at least 20 imported VM files in %s, have %d (%v)", importDir, len(files), err)
	}
	ns := newNetns(t)
	ports := targetPorts(t, ctx, tg)
	t.Logf("relaying loopback ports %v into %s", ports, ns)
	relayLoopback(t, ns, ports)
	root, dir := t.TempDir(), t.TempDir()
	si := &standIns{t: t, ctx: ctx, tg: tg, dir: dir, iqns: map[string]bool{}}
	si.key = filepath.Join(dir, "ceph.key")
	if err := os.WriteFile(si.key, []byte(tg.ceph.AdminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	skipped := 0
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".toml")
		ok := t.Run(name, func(t *testing.T) {
			si.t = t
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			f, err := spec.Parse(file, data)
			if err != nil {
				t.Fatal(err)
			}
			vm := &f.VM
			if why := hostNeeds(vm); why != "" {
				skipped++
				t.Skip(why)
			}
			for _, n := range vm.NICs {
				if n.Type == spec.NICOVS {
					skipped++
					t.Skipf("nic %s: an Open vSwitch bridge (package networktest runs OVS)", n.Name)
				}
			}
			si.vm(vm)
			b, err := toml.Marshal(vm)
			if err != nil {
				t.Fatal(err)
			}
			stood := filepath.Join(dir, name+".toml")
			if err := os.WriteFile(stood, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := inNetns(ctx, ns, root, vmsupBin, "validate", stood); err != nil {
				t.Fatalf("vmsup validate of the stood-in %s: %v\n%s", name, err, out)
			}
			startS(t, ctx, ns, vm, dir, si)
		})
		if !ok {
			t.Logf("%s failed", name)
		}
	}
	t.Logf("%d of %d imported files validated and started; %d skipped", len(files)-skipped, len(files), skipped)
}

// hostNeeds is why this host cannot start vm ("" when it can): SEV
// needs an SEV host, hugepages free pages on a hugetlbfs mount.
func hostNeeds(vm *spec.VM) string {
	if vm.SEV != nil {
		if why := caps.SEVReason(); why != "" {
			return "sev: " + why
		}
	}
	if vm.Hugepages != "" {
		if _, err := (hugepages.Host{}).Check(vm); err != nil {
			return "hugepages: " + err.Error()
		}
	}
	return ""
}

// standIns makes what an imported file names outside itself.
type standIns struct {
	t    *testing.T
	ctx  context.Context
	tg   *targets
	dir  string
	key  string
	iqns map[string]bool
}

func (s *standIns) run(name string, args ...string) {
	s.t.Helper()
	if out, err := exec.CommandContext(s.ctx, name, args...).CombinedOutput(); err != nil {
		s.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (s *standIns) vm(vm *spec.VM) {
	if b := &vm.Boot; b.Kernel != "" {
		b.Kernel = env.Guest.Kernel
		if b.Initrd != "" {
			b.Initrd = env.Guest.Initrd
		}
	}
	for i := range vm.Disks {
		s.disk(vm.Name, &vm.Disks[i])
	}
	for i := range vm.Shares {
		vm.Shares[i].Path = filepath.Join(s.dir, vm.Name+"-share"+strconv.Itoa(i))
		if err := os.MkdirAll(vm.Shares[i].Path, 0o755); err != nil {
			s.t.Fatal(err)
		}
	}
}

func (s *standIns) disk(vmName string, d *spec.Disk) {
	c := s.tg.ceph
	switch d.Type {
	case spec.DiskFile, spec.DiskISO:
		d.File = filepath.Join(s.dir, vmName+"-"+d.Name+"."+d.Format)
		s.run("qemu-img", "create", "-q", "-f", d.Format, d.File, "64M")
	case spec.DiskBlock:
		img := filepath.Join(s.dir, vmName+"-"+d.Name+".img")
		s.run("qemu-img", "create", "-q", "-f", "raw", img, "64M")
		out, err := exec.CommandContext(s.ctx, "losetup", "-f", "--show", img).CombinedOutput()
		if err != nil {
			s.t.Fatalf("losetup: %v %s", err, out)
		}
		d.File = strings.TrimSpace(string(out))
		s.t.Cleanup(func() { exec.Command("losetup", "-d", d.File).Run() })
	case spec.DiskRBD:
		img := d.Pool + "/" + d.Image
		if d.Namespace != "" {
			c.RBD(s.ctx, "namespace", "create", d.Pool+"/"+d.Namespace) // an error: it exists
			img = d.Pool + "/" + d.Namespace + "/" + d.Image
		}
		if _, err := c.RBD(s.ctx, "info", img); err != nil {
			if out, err := c.RBD(s.ctx, "create", img, "--size", "64"); err != nil {
				s.t.Fatalf("%v %s", err, out)
			}
		}
		if d.Snapshot != "" {
			c.RBD(s.ctx, "snap", "create", img+"@"+d.Snapshot) // an error: it exists
		}
		d.Monitors = []string{c.MonAddr}
		if d.SecretFile != "" { // libvirt's secret file: the cluster's key
			d.SecretFile, d.CephConf = s.key, c.ClientConf
		} else { // the default ceph.conf: one with the admin keyring
			d.CephConf = c.Conf
		}
	case spec.DiskISCSI:
		if !s.iqns[d.Target] {
			lun := filepath.Join(s.dir, strings.ReplaceAll(d.Target, ":", "_")+".lun")
			if err := testenv.MakeFile(lun, 64<<20); err != nil {
				s.t.Fatal(err)
			}
			var o testenv.TargetOptions
			if d.InitiatorName != "" {
				o.Initiators = []string{d.InitiatorName}
			}
			if err := s.tg.tgt.AddTargetWith(s.ctx, s.tg.tid(), d.Target, lun, o); err != nil {
				s.t.Fatal(err)
			}
			s.iqns[d.Target] = true
		}
		d.Portal = s.tg.tgt.Portal
	}
}

// newNetns makes a network namespace with the bridges the imported files
// name (br0 with a 9000-byte MTU, libvirt's virbr0) and removes it at the
// end.
func newNetns(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("vmsup-imp-%d", os.Getpid())
	cmds := [][]string{{"netns", "add", ns}, {"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "br0", "type", "bridge"}, {"-n", ns, "link", "set", "br0", "mtu", "9000"},
		{"-n", ns, "link", "add", "virbr0", "type", "bridge"}}
	for i, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
		if i == 0 {
			t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		}
	}
	return ns
}

// inNetns runs a command in ns with the vmsup environment of this
// package's sandbox.
func inNetns(ctx context.Context, ns, root string, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Env = append(os.Environ(), "VMSUP_ROOT="+root, "VMSUP_SYSTEMD_BUS="+env.Systemd.BusAddress,
		"VMSUP_JOURNAL_DIR="+env.Systemd.JournalDir, "VMSUP_RUN_DIR="+filepath.Join(root, "run"))
	cmd.Env = append(cmd.Env, env.CLIEnv()...)
	return cmd.CombinedOutput()
}

// startS builds vm's argv as vmsup does and starts it in QEMU -S in ns:
// QEMU takes every option and device, QMP answers "prelaunch", and it
// quits.
func startS(t *testing.T, ctx context.Context, ns string, vm *spec.VM, dir string, si *standIns) {
	t.Helper()
	run := filepath.Join(dir, "run-"+vm.Name)
	if err := os.MkdirAll(run, 0o700); err != nil {
		t.Fatal(err)
	}
	o := qemuargs.Options{Binary: env.QEMU, Accel: spec.AccelTCG, QMPSocket: filepath.Join(run, "qmp"),
		EventSocket: filepath.Join(run, "ev"), ConsoleSocket: filepath.Join(run, "con"), AgentSocket: filepath.Join(run, "qga"),
		VNCSocket: filepath.Join(run, "vnc"), UUID: uuid.NewString(), GenID: uuid.NewString(), Disks: map[string]qemuargs.DiskHost{}}
	for _, d := range vm.Disks {
		if d.NeedsSecret() {
			o.Disks[d.Name] = qemuargs.DiskHost{SecretFile: si.key}
		}
	}
	if err := identity.WriteCredentials(run, vm); err != nil {
		t.Fatal(err)
	}
	o.Credentials = identity.CredentialPaths(run, vm)
	if vm.TPM != nil {
		o.TPMSocket = testenv.StartSwtpm(t, filepath.Join(run, "tpm"))
	}
	if vm.Hugepages != "" {
		mount, err := (hugepages.Host{}).Check(vm) // hostNeeds saw it work
		if err != nil {
			t.Fatal(err)
		}
		o.Hugetlbfs = mount
	}
	if vm.Boot.Firmware == spec.FirmwareUEFI {
		o.FirmwareCode, o.FirmwareVars = caps.BootCode(vm.Boot), filepath.Join(run, "vars.fd")
		b, err := os.ReadFile(caps.VarsTemplate(vm.Boot))
		if err != nil {
			t.Fatalf("OVMF (installed by scripts/install-deps.sh): %v", err)
		}
		if err := os.WriteFile(o.FirmwareVars, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	argv, err := qemuargs.Build(vm, o)
	if err != nil {
		t.Fatal(err)
	}
	argv = append(argv, "-S")
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("QEMU exited before QMP answered (%v):\n%s\nargv: %q", err, out.String(), argv)
		default:
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := qmp.Dial(dctx, o.QMPSocket)
		cancel()
		if err == nil {
			st, err := c.QueryStatus(ctx)
			if err != nil || st.Status != "prelaunch" {
				t.Errorf("query-status: %+v, %v", st, err)
			}
			c.Quit(ctx)
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("QMP at %s: %v\n%s", o.QMPSocket, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// relayLoopback makes ports of the host's 127.0.0.1 reachable at the same
// addresses inside ns: the storage targets run on the host's loopback,
// the imported files are validated in ns (for its bridges). Each listener
// is opened in ns and each connection dialled from the host's namespace.
func relayLoopback(t *testing.T, ns string, ports []int) {
	t.Helper()
	target, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	var ls []net.Listener
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			t.Fatal(err)
		}
		defer netns.Set(orig)
		for _, p := range ports {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				t.Errorf("relay listener on port %d in %s: %v", p, ns, err)
				continue
			}
			ls = append(ls, l)
		}
	}()
	for _, l := range ls {
		t.Cleanup(func() { l.Close() })
		go func(l net.Listener) {
			for {
				in, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer in.Close()
					out, err := net.Dial("tcp", l.Addr().String())
					if err != nil {
						return
					}
					defer out.Close()
					go io.Copy(out, in)
					io.Copy(in, out)
				}()
			}
		}(l)
	}
}

var loopPort = regexp.MustCompile(`127\.0\.0\.1:(\d+)`)

// targetPorts are the loopback ports clients of tgtd and the cluster use:
// the portal, the monitor and every OSD address.
func targetPorts(t *testing.T, ctx context.Context, tg *targets) []int {
	t.Helper()
	// The OSD may not be up yet (rbd waits for it, a relay cannot): its
	// address is known once it is.
	var osds string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		out, err := tg.ceph.CLI(ctx, "osd", "dump", "--format", "json")
		if err != nil {
			t.Fatal(err)
		}
		if osds = string(out); strings.Contains(osds, `"public_addr":"127.0.0.1:`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the OSD has no address after a minute: %s", osds)
		}
	}
	text := tg.tgt.Portal + " " + tg.ceph.MonAddr + " " + osds
	seen := map[int]bool{}
	var ports []int
	for _, m := range loopPort.FindAllStringSubmatch(text, -1) {
		p, _ := strconv.Atoi(m[1])
		if !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports
}
