package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestCLIImport: vmsup import writes a VM file that loads, lists what it
// could not carry over on stderr, never replaces a file unless told, reads
// stdin, and fails with one line naming the file.
func TestCLIImport(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	xml, err := filepath.Abs("../../testdata/import/dump-basic.xml")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "basic.toml")
	// The domain's images are in vmsup's default image directory, the
	// only place of this host it names.
	imageDir := "--image-dir=/var/lib/vmsup/images"
	r := vmsup(t, root, "", imageDir, "import", xml, "-o", out)
	if r.code != 0 || !strings.Contains(r.stderr, "vmsup import: not carried over: devices/audio[0]") ||
		!strings.Contains(r.stderr, "wrote "+out) {
		t.Fatalf("import -o: %+v", r)
	}
	if f, err := spec.Load(out); err != nil || f.VM.Name != "basic" {
		t.Fatalf("the imported file: %v", err)
	}
	before, _ := os.ReadFile(out)
	if r := vmsup(t, root, "", imageDir, "import", xml, "-o", out); r.code != 1 || !strings.Contains(r.stderr, out+" exists") {
		t.Errorf("import over an existing file: %+v", r)
	}
	if after, _ := os.ReadFile(out); string(after) != string(before) {
		t.Error("a refused import changed the existing file")
	}
	if r := vmsup(t, root, "", imageDir, "import", xml, "-o", out, "--force"); r.code != 0 {
		t.Errorf("import --force: %+v", r)
	}
	data, _ := os.ReadFile(xml)
	if r := vmsup(t, root, string(data), imageDir, "import", "-"); r.code != 0 || !strings.Contains(r.stdout, "name = 'basic'") {
		t.Errorf("import - (stdin): %+v", r)
	}
	bad := write(t, dir, "bad.xml", "<network><name>n</name></network>")
	if r := vmsup(t, root, "", "import", bad); r.code != 1 || !strings.Contains(r.stderr, bad+": not a libvirt domain XML") ||
		strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("import of a network XML: %+v", r)
	}
}

// TestCLIImportManagedNetwork: vmsup import puts a NIC on libvirt network
// "lab" on the managed network "lab" when the state root defines one
// (ROOT/networks/lab/network.toml, as vmsup network create stores it; the
// bridge and dnsmasq are not needed to import), clean-traffic as its
// anti-spoofing; with no such network it stays on the bridge, with a line
// naming vmsup network create.
func TestCLIImportManagedNetwork(t *testing.T) {
	root := t.TempDir()
	xml, err := filepath.Abs("../../testdata/import/networks/clean-traffic.xml")
	if err != nil {
		t.Fatal(err)
	}
	allow := "--allow-path=/var/lib/libvirt/images"
	r := vmsup(t, root, "", allow, "import", xml)
	if r.code != 0 || !strings.Contains(r.stdout, "type = 'bridge'\nmac = '52:54:00:4e:00:01'\nbridge = 'lab'") ||
		!strings.Contains(r.stderr, `make a vmsup managed network called "lab" (vmsup network create)`) {
		t.Fatalf("import with no managed network: %+v", r)
	}
	dir := filepath.Join(root, "networks", "lab")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "network.toml", "name = \"lab\"\nipv4 = \"10.77.0.1/24\"\n")
	r = vmsup(t, root, "", allow, "import", xml)
	if r.code != 0 || !strings.Contains(r.stdout, "type = 'network'\nmac = '52:54:00:4e:00:01'\nnetwork = 'lab'\nip = '10.77.0.50'") ||
		strings.Contains(r.stdout, "allow_spoofing") || strings.Contains(r.stderr, "vmsup network create") {
		t.Fatalf("import with managed network lab: %+v", r)
	}
	if f, err := spec.Parse("lab.toml", []byte(r.stdout)); err != nil || f.VM.NICs[0].AllowSpoofing {
		t.Fatalf("the imported file: %v", err)
	}
}
