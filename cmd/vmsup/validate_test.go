package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// TestCLIValidateOneRun: one validate run names every problem of a file:
// a value of the wrong type, a bad value and a missing bridge (a host
// check), one line each in file order, exit 1.
func TestCLIValidateOneRun(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "one.toml", "name='one'\nmemory='256M'\ncpus='two'\nmachine='q99'\n[boot]\nkernel='"+env.Guest.Kernel+"'\n"+
		"[[nic]]\nname='lan'\ntype='bridge'\nbridge='nosuchbr0'\n")
	r := vmsup(t, t.TempDir(), "", "validate", p)
	want := "vmsup: " + p + ":3:6: cpus: want a whole number, not a TOML string\n" +
		"vmsup: " + p + ":4:1: machine: unknown machine \"q99\" (want \"q35\", \"pc\", or a versioned pc-q35-X.Y or pc-i440fx-X.Y)\n" +
		"vmsup: " + p + ":10:1: nic[0].bridge: nic \"lan\": no Linux bridge \"nosuchbr0\" on this host\n"
	if r.code != 1 || r.stderr != want || r.stdout != "" {
		t.Fatalf("validate: %+v\nwant exit 1, stderr:\n%s", r, want)
	}
	// Sizes in flags are binary too: "1GB" is refused, not taken as 1G.
	r = vmsup(t, t.TempDir(), "", "set", "nosuch", "--memory", "1GB")
	if want := "vmsup: --memory: \"1GB\" is ambiguous: write \"1G\" (GiB, 1024^3) or \"1000M\"\n"; r.code != 2 || r.stderr != want {
		t.Fatalf("set --memory 1GB: %+v\nwant exit 2, stderr %s", r, want)
	}
	if strings.Contains(r.stdout, "nosuch") {
		t.Errorf("set ran: %q", r.stdout)
	}
}

// TestCLIValidateSharedImage: one image under two names (two device
// nodes of one loop device, the base of an existing overlay; a symlink is
// refused as one) used
// by two disks is refused at validate time naming both disks; QEMU would
// refuse it at start with its write lock. Read-only disks may share one.
func TestCLIValidateSharedImage(t *testing.T) {
	dir := t.TempDir()
	head := "name='sh'\nmemory='256M'\n[boot]\nkernel='" + env.Guest.Kernel + "'\n"
	raw := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := raw("a.raw")
	link := filepath.Join(dir, "link.raw")
	if err := os.Symlink(a, link); err != nil {
		t.Fatal(err)
	}
	// A loop device and a second node of it, as /dev/disk/by-* names are.
	out, err := exec.Command("losetup", "--find", "--show", raw("b.raw")).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup (a loop device is needed for the block device case): %v %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", loop).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v %s", loop, err, out)
		}
	})
	var st syscall.Stat_t
	if err := syscall.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	alias := filepath.Join(dir, "loop-alias")
	if err := syscall.Mknod(alias, syscall.S_IFBLK|0o600, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}
	base, top := filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "top.qcow2")
	for _, args := range [][]string{{"create", "-f", "qcow2", base, "1M"}, {"create", "-f", "qcow2", "-b", base, "-F", "qcow2", top}} {
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v %s", args, err, out)
		}
	}
	iso := raw("d.iso")
	const also = " (one image can back only one disk)"
	for _, c := range []struct{ name, disks, want string }{
		// A second name by symlink is refused before it can be a second
		// name (issue 45: images are opened by their own name only).
		{"symlink", "[[disk]]\nname='root'\nfile='" + a + "'\n[[disk]]\nname='data'\nfile='" + link + "'\n",
			":10:1: disk[1].file: vm \"sh\": disk \"data\": " + link + " is a symlink: refused, disk images are opened by their own name (name the file it leads to): outside its directory or through a symlink"},
		{"block device", "[[disk]]\nname='a'\ntype='block'\nfile='" + loop + "'\n[[disk]]\nname='b'\ntype='block'\nfile='" + alias + "'\n",
			":12:1: disk[1].file: " + alias + " is also disk \"a\"'s image " + loop + also},
		{"one block device used by three disks", "[[disk]]\nname='a'\ntype='block'\nfile='" + loop + "'\n[[disk]]\nname='b'\ntype='block'\ndevice='lun'\nfile='" + alias +
			"'\n[[disk]]\nname='c'\ntype='block'\nread_only=true\nfile='" + loop + "'\n",
			":13:1: disk[1].file: " + alias + " is also disk \"a\"'s image " + loop + also + "\n" +
				":18:1: disk[2].file: " + loop + " is also disk \"a\"'s image, which it writes" + also},
		{"overlay on another disk's image", "[[disk]]\nname='base'\nfile='" + base + "'\n[[disk]]\nname='top'\nfile='" + top + "'\n",
			":10:1: disk[1].file: its base image " + base + " is also disk \"base\"'s image, which it writes" + also},
		{"an ISO twice", "[[disk]]\nname='cd1'\ntype='iso'\nfile='" + iso + "'\n[[disk]]\nname='cd2'\ntype='iso'\nfile='" + iso + "'\n", ""},
	} {
		p := write(t, dir, "sh.toml", head+c.disks)
		r := vmsup(t, t.TempDir(), "", "validate", p)
		if c.want == "" {
			if r.code != 0 {
				t.Errorf("%s: %+v, want valid", c.name, r)
			}
			continue
		}
		want := ""
		for _, line := range strings.Split(c.want, "\n") { // one line an error
			want += "vmsup: " + p + line + "\n"
		}
		if r.code != 1 || r.stderr != want {
			t.Errorf("%s: %+v\nwant exit 1, stderr %s", c.name, r, want)
		}
	}
}

// TestCLIValidateSEV: an SEV VM (what vmsup import makes of a domain with
// <launchSecurity type='sev'>) is refused on a host that cannot encrypt
// it, naming the sev key and the probe's reason.
func TestCLIValidateSEV(t *testing.T) {
	why := caps.SEVReason()
	if why == "" {
		t.Skip("this host runs SEV guests: nothing to refuse")
	}
	dir := t.TempDir()
	p := write(t, dir, "enc.toml", "name='enc'\nmemory='256M'\n[boot]\nkernel='"+env.Guest.Kernel+"'\n[sev]\npolicy=3\ncbitpos=47\nreduced_phys_bits=1\n")
	r := vmsup(t, t.TempDir(), "", "validate", p)
	if want := p + ":5:2: sev: this host cannot run SEV guests: " + why; r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("%+v\nwant exit 1 and %s", r, want)
	}
}

// TestCLIValidatePhysBits: 1 TiB of max_memory (issue 51's figure;
// libvirt's memory-hotplug-dimm asks for 1 PiB, and so does its import),
// which QEMU refuses on a qemu64 vCPU ("phys-bits too low (40)"):
// validate refuses it first, in one line naming the file, the field, the
// top address and the phys-bits. Under KVM the default CPU's
// phys-bits are the host's (qemuargs' TestPhysBitsInQEMU checks both
// against QEMU's own refusal).
func TestCLIValidatePhysBits(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "big.toml", "name='big'\nmemory='214M'\nmax_memory='1T'\ncpu_model='qemu64'\n[boot]\nkernel='"+env.Guest.Kernel+"'\n")
	r := vmsup(t, t.TempDir(), "", "validate", p)
	want := "vmsup: " + p + ":3:1: max_memory: 1T puts the guest's highest address at 0x208ffffffff, past the 40 physical address bits (phys-bits) of -cpu qemu64 under "
	if r.code != 1 || !strings.HasPrefix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("%+v\nwant exit 1 and one line %s...", r, want)
	}
	// vmsup import's VM file of that domain (its disk is elsewhere too).
	p, err := filepath.Abs("../../testdata/import/issue51/memory-hotplug-1t.toml")
	if err != nil {
		t.Fatal(err)
	}
	r = vmsup(t, t.TempDir(), "", "validate", p)
	want = "vmsup: " + p + ":10:1: max_memory: 1024T puts the guest's highest address at 0x40108ffffffff, past the 40 physical address bits (phys-bits) of -cpu qemu64 under "
	if r.code != 1 || !strings.HasPrefix(r.stderr, want) {
		t.Errorf("imported: %+v\nwant exit 1 and first %s...", r, want)
	}

	if ok, why := env.Caps.KVM.Starts(); !ok {
		t.Skipf("the host's phys-bits apply under KVM, and here %s", why)
	}
	model, _, err := env.Caps.CPU(spec.AccelKVM, "")
	if err != nil {
		t.Skipf("under this host's KVM: %v", err)
	}
	bits := qemuargs.GuestPhysBits(spec.AccelKVM, model, caps.PhysBits())
	if model == "host" && bits == qemuargs.DefaultPhysBits {
		t.Skip("/proc/cpuinfo gives no address sizes: validate assumes QEMU's 40")
	}
	limit := spec.Size(1) << bits // 2^bits of hotplug memory is always past it
	p = write(t, dir, "host.toml", "name='host'\nmemory='214M'\nmax_memory='"+limit.String()+"'\naccel='kvm'\n[boot]\nkernel='"+env.Guest.Kernel+"'\n")
	r = vmsup(t, t.TempDir(), "", "validate", p)
	want = fmt.Sprintf("vmsup: %s:3:1: max_memory: %s puts the guest's highest address at 0x", p, limit)
	mid := fmt.Sprintf(", past the %d physical address bits (phys-bits) of -cpu %s under kvm: QEMU would refuse it (at most ", bits, model)
	if r.code != 1 || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, mid) || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("%+v\nwant exit 1 and one line %s...%s...", r, want, mid)
	}
}
