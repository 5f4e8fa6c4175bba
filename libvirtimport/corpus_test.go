package libvirtimport

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// corpusDir holds domain XMLs written for issue 33 in the shapes of
// libvirt's own test data (tests/qemuxml2argvdata): one or a few device
// elements each, across libvirt's device and domain elements.
const corpusDir = "../testdata/import/corpus"

// TestCorpus imports every corpus XML: none may abort as a vmsup bug, a
// refusal must say why, and every VM file made loads and renders to an
// argv. It reports how many import with nothing dropped.
func TestCorpus(t *testing.T) {
	xmls, _ := filepath.Glob(filepath.Join(corpusDir, "*.xml"))
	if len(xmls) < 60 {
		t.Fatalf("want at least 60 domain XMLs in %s, have %d", corpusDir, len(xmls))
	}
	clean, lines := 0, 0
	var refused []string
	for _, x := range xmls {
		name := strings.TrimSuffix(filepath.Base(x), ".xml")
		data, err := os.ReadFile(x)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Convert(data, filepath.Base(x))
		if err != nil {
			if strings.Contains(err.Error(), "vmsup import bug") || strings.Count(err.Error(), "\n") > 0 {
				t.Errorf("%s: %v", name, err)
			}
			refused = append(refused, err.Error())
			continue
		}
		if len(res.Dropped) == 0 {
			clean++
		}
		lines += len(res.Dropped)
		f, err := spec.Parse("/import/"+name+".toml", res.TOML)
		if err != nil {
			t.Errorf("%s: the VM file does not load: %v", name, err)
			continue
		}
		if _, err := qemuargs.Build(&f.VM, hostOptions(&f.VM)); err != nil {
			t.Errorf("%s: no argv: %v", name, err)
		}
	}
	t.Logf("corpus: %d domain XMLs: %d imported with nothing dropped, %d with %d lines, %d refused",
		len(xmls), clean, len(xmls)-clean-len(refused), lines, len(refused))
	for _, r := range refused {
		t.Logf("refused: %s", r)
	}
}

// hostOptions are goldenOptions with what the supervisor makes for the
// VM's devices: secret and credential files, sockets, ids.
func hostOptions(vm *spec.VM) qemuargs.Options {
	run := "/run/vmsup/" + vm.Name + "/"
	o := goldenOptions(vm)
	o.VhostNet, o.GenID, o.VsockCID = true, "43dc0cf8-809b-4adb-9bea-a9abb5f3d90d", spec.MinVsockCID
	if vm.Vsock.CID != 0 {
		o.VsockCID = uint32(vm.Vsock.CID)
	}
	o.ShareSockets, o.Credentials, o.Disks = map[string]string{}, map[string]string{}, map[string]qemuargs.DiskHost{}
	for _, s := range vm.Shares {
		o.ShareSockets[s.Tag] = run + "fs-" + s.Tag + ".sock"
	}
	for _, c := range vm.CredentialNames() {
		o.Credentials[c] = run + "credentials/" + c
	}
	for _, d := range vm.Disks {
		if d.NeedsSecret() {
			o.Disks[d.Name] = qemuargs.DiskHost{SecretFile: run + "secrets/" + d.Name}
		}
	}
	return o
}
