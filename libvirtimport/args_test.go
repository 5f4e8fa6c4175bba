package libvirtimport

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// TestImportedArgs: what issue 33 found lost or aborting now reaches
// QEMU's command line. Each testdata/import/parity-*.xml is imported, and
// its VM file's argv (fixed host options) equals parity-*.args (-update
// rewrites them). supervisor/paritytest starts the same files in QEMU -S.
func TestImportedArgs(t *testing.T) {
	xmls, _ := filepath.Glob(filepath.Join(goldenDir, "parity-*.xml"))
	if len(xmls) < 8 {
		t.Fatalf("want the parity-*.xml files of issue 33 in %s, have %d", goldenDir, len(xmls))
	}
	checkArgs(t, xmls, goldenOptions)
}

// issue51Dir holds domain XMLs in the shapes of libvirt's test data
// whose settings import carried differently without a line (issue 51):
// a VM file (*.toml) and an argv (*.args) golden each.
const issue51Dir = "../testdata/import/issue51"

// TestIssue51Goldens: each is carried the way libvirt means it, or with
// one line naming what changed (the goldens' headers).
func TestIssue51Goldens(t *testing.T) {
	checkGoldens(t, issue51Dir, 10, Options{})
	xmls, _ := filepath.Glob(filepath.Join(issue51Dir, "*.xml"))
	checkArgs(t, xmls, hostOptions)
}

// checkArgs imports each of xmls and compares its VM file's argv (with
// opts' fixed host options) with the .args beside it (-update rewrites
// them).
func checkArgs(t *testing.T, xmls []string, opts func(*spec.VM) qemuargs.Options) {
	for _, x := range xmls {
		name := strings.TrimSuffix(filepath.Base(x), ".xml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(x)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Convert(data, filepath.Base(x))
			if err != nil {
				t.Fatal(err)
			}
			f, err := spec.Parse("/import/"+name+".toml", res.TOML)
			if err != nil {
				t.Fatal(err)
			}
			argv, err := qemuargs.Build(&f.VM, opts(&f.VM))
			if err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(x, ".xml") + ".args"
			if *update {
				if err := os.WriteFile(golden, []byte(strings.Join(argv, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./libvirtimport -update)", err)
			}
			if diff := cmp.Diff(strings.Split(strings.TrimSuffix(string(want), "\n"), "\n"), argv); diff != "" {
				t.Errorf("argv of %s differs (-want +got):\n%s", name, diff)
			}
		})
	}
}

// goldenOptions are fixed host facts: TCG (KVM for SEV and for Hyper-V
// enlightenments, which QEMU has only under KVM), sockets and firmware
// at fixed paths.
func goldenOptions(vm *spec.VM) qemuargs.Options {
	run := "/run/vmsup/" + vm.Name + "/"
	o := qemuargs.Options{Binary: "/usr/bin/qemu-system-x86_64", Accel: spec.AccelTCG,
		QMPSocket: run + "qmp.sock", EventSocket: run + "qmp-events.sock", ConsoleSocket: run + "console.sock",
		AgentSocket: run + "guest-agent.sock", TPMSocket: run + "tpm.sock", VNCSocket: run + "vnc.sock", Hugetlbfs: "/dev/hugepages",
		FirmwareCode: "/usr/share/OVMF/OVMF_CODE_4M.fd", FirmwareVars: run + "OVMF_VARS.fd"}
	if hv, _ := vm.CPU.HypervList(); vm.SEV != nil || len(hv) > 0 {
		o.Accel = spec.AccelKVM
	}
	if vm.Boot.SecureBoot {
		o.FirmwareCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	}
	return o
}
