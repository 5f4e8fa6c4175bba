package libvirtimport

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/spec"
)

var update = flag.Bool("update", false, "rewrite testdata/import/*.toml from Convert's output")

// goldenDir holds domain XMLs written by virt-install and virsh
// (scripts/import-goldens.sh) and the VM files Convert makes of them.
const goldenDir = "../testdata/import"

// TestGolden converts every stored domain XML and compares the VM file
// with its golden; each must load, and none may leave an element unlisted.
func TestGolden(t *testing.T) {
	checkGoldens(t, goldenDir, 20, Options{})
}

// netGoldenDir holds domains with NICs on libvirt networks, some with
// nwfilter references, imported on a host whose only managed network is
// "lab" (apart from testdata/import: those files name a network that
// package paritytest's start of every imported file does not make).
const netGoldenDir = "../testdata/import/networks"

// TestNetworkGoldens: a NIC on libvirt network "lab" goes on the managed
// network "lab" (clean-traffic is its anti-spoofing, the IP parameter or
// <ip> its address; without clean-traffic, or with another filter, a
// line); one on another network stays on the bridge, with a line.
func TestNetworkGoldens(t *testing.T) {
	checkGoldens(t, netGoldenDir, 4, Options{ManagedNetworks: []string{"lab"}})
}

// checkGoldens converts each DIR/*.xml with o and compares the VM file
// with DIR/*.toml (-update rewrites them); each must load.
func checkGoldens(t *testing.T, dir string, atLeast int, o Options) {
	xmls, err := filepath.Glob(filepath.Join(dir, "*.xml"))
	if err != nil || len(xmls) < atLeast {
		t.Fatalf("want at least %d domain XMLs in %s, have %d (%v)", atLeast, dir, len(xmls), err)
	}
	for _, x := range xmls {
		name := strings.TrimSuffix(filepath.Base(x), ".xml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(x)
			if err != nil {
				t.Fatal(err)
			}
			res, err := ConvertWith(data, filepath.Base(x), o)
			if err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(x, ".xml") + ".toml"
			if *update {
				if err := os.WriteFile(golden, res.TOML, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./libvirtimport -update)", err)
			}
			if diff := cmp.Diff(string(want), string(res.TOML)); diff != "" {
				t.Errorf("Convert(%s) differs from %s (-want +got); -update if intended:\n%s", filepath.Base(x), filepath.Base(golden), diff)
			}
			if _, err := spec.Parse("/import/"+name+".toml", res.TOML); err != nil {
				t.Errorf("the VM file does not load: %v", err)
			}
		})
	}
}

// TestRefuses: what is not a QEMU x86-64 domain is an error naming the file.
func TestRefuses(t *testing.T) {
	for _, c := range []struct{ xml, want string }{
		{`<domain type='xen'><name>x</name><memory>1024</memory></domain>`, `x.xml: domain type "xen"`},
		{`<domain type='kvm'><name>a</name><memory>1024</memory><os><type arch='aarch64'>hvm</type></os></domain>`, `x.xml: architecture "aarch64"`},
		{`<domain type='kvm'><name>m</name></domain>`, "x.xml: no <memory>"},
		{`<network><name>n</name></network>`, "x.xml: not a libvirt domain XML"},
		{`<domain type='kvm'><name>p</name><memory>1024</memory><os><boot dev='network'/></os></domain>`, "x.xml: nothing vmsup can boot"},
		{`<domain type='kvm'><name>v</name><memory>1024</memory><devices><disk type='volume'><source pool='p' volume='v'/><target dev='vda'/></disk></devices></domain>`,
			"x.xml: nothing vmsup can boot: no disk or kernel was carried over (devices/disk[0] (vda): storage pool volume p/v"},
	} {
		if _, err := Convert([]byte(c.xml), "x.xml"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Convert(%s): %v, want %q", c.xml, err, c.want)
		}
	}
}
