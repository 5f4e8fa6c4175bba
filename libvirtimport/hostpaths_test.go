package libvirtimport

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	hostpaths "github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/spec"
)

// TestHostPaths: with the host's places (Options.CheckPath), a source
// outside them (/etc/shadow as it is, through a symlink in an image
// directory, by ".." out of libvirt's or vmsup's image directory) is not
// written: its disk, share, kernel or secret's disk is listed as not
// carried over, with why; what lies in the places is kept as written.
func TestHostPaths(t *testing.T) {
	d := t.TempDir()
	images := filepath.Join(d, "images")
	if err := os.MkdirAll(filepath.Join(images, "share"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(images, "shadow.raw")
	if err := os.Symlink("/etc/shadow", link); err != nil {
		t.Fatal(err)
	}
	p := &hostpaths.Places{ImageDirs: []string{images, "/var/lib/libvirt/images"}, BlockDirs: []string{"/dev/disk/by-id"}, ConfigDirs: []string{"/etc/ceph"}}
	o := Options{CheckPath: p.Check}
	disk := func(dev, src string) string {
		return fmt.Sprintf("<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='%s'/><target dev='%s' bus='virtio'/></disk>\n", src, dev)
	}
	xml := fmt.Sprintf(`<domain type='kvm'><name>hp</name><memory unit='MiB'>512</memory>
<os><type arch='x86_64' machine='q35'>hvm</type><kernel>%s</kernel><initrd>/etc/shadow</initrd></os>
<devices>
%s%s%s%s%s<disk type='block' device='disk'><source dev='/etc/shadow'/><target dev='vdf' bus='virtio'/></disk>
<disk type='network' device='disk'><source protocol='rbd' name='pool/img'><host name='192.0.2.1' port='6789'/><config file='/etc/shadow'/></source><target dev='vdg' bus='virtio'/></disk>
<filesystem type='mount' accessmode='passthrough'><source dir='%s'/><target dir='ok'/></filesystem>
<filesystem type='mount' accessmode='passthrough'><source dir='/etc'/><target dir='etc'/></filesystem>
</devices></domain>`, filepath.Join(images, "vmlinuz"),
		disk("vda", filepath.Join(images, "root.qcow2")), disk("vdb", "/etc/shadow"), disk("vdc", link),
		disk("vdd", "/var/lib/libvirt/images/../../../../etc/shadow"), disk("vde", images+"/../../../../../../../etc/shadow"),
		filepath.Join(images, "share"))
	res, err := ConvertWith([]byte(xml), "hp.xml", o)
	if err != nil {
		t.Fatal(err)
	}
	f, err := spec.Parse("/import/hp.toml", res.TOML)
	if err != nil {
		t.Fatalf("the VM file does not load: %v\n%s", err, res.TOML)
	}
	if len(f.VM.Disks) != 1 || f.VM.Disks[0].File != filepath.Join(images, "root.qcow2") || len(f.VM.Shares) != 1 ||
		f.VM.Boot.Kernel != filepath.Join(images, "vmlinuz") || f.VM.Boot.Initrd != "" {
		t.Errorf("carried over: disks %+v, shares %+v, boot %+v; want only root.qcow2, the share in images and the kernel", f.VM.Disks, f.VM.Shares, f.VM.Boot)
	}
	var dropped []string
	for _, x := range res.Dropped {
		dropped = append(dropped, x.String())
	}
	all := strings.Join(dropped, "\n")
	for _, want := range []string{
		"os/initrd: initrd /etc/shadow is outside the places VM files may name",
		"devices/disk[1] (vdb): source /etc/shadow is outside the places",
		"devices/disk[2] (vdc): source " + link + " (leads to /etc/shadow) is outside the places",
		"devices/disk[3] (vdd): source /var/lib/libvirt/images/../../../../etc/shadow (leads to /etc/shadow) is outside the places",
		"devices/disk[4] (vde): source " + images + "/../../../../../../../etc/shadow (leads to /etc/shadow) is outside the places",
		"devices/disk[5] (vdf): source /etc/shadow is outside the places VM files may name (image directories: " + images +
			", /var/lib/libvirt/images; block device directories: /dev/disk/by-id): move it there, or allow its directory on this host (--image-dir, --block-dir or --allow-path DIR)",
		"devices/disk[6] (vdg): ceph config /etc/shadow is outside the places VM files may name (configuration directories: /etc/ceph)",
		"devices/filesystem[1]: source /etc is outside the places",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("not listed: %q\nDropped:\n%s", want, all)
		}
	}
}
