package qemuargs

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	hostcaps "github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/spec"
)

// TestVideoDevicesInQEMU: every video value's device is one this host's
// QEMU offers (qemu-system-x86_64 -device help), as are the tablet's, or
// one the host probe says it lacks (Debian's QEMU 10 has qxl only with
// qemu-system-modules-spice): that one is skipped with the probe's reason.
func TestVideoDevicesInQEMU(t *testing.T) {
	env := needQEMU(t)
	out, err := exec.Command(env.qemu, "-device", "help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -device help: %v\n%s", env.qemu, err, out)
	}
	drivers := []string{"qemu-xhci", "usb-tablet"}
	for _, v := range spec.VideoDevices {
		if d := VideoDriver(v); d != "" {
			drivers = append(drivers, d)
		} else if v != spec.VideoNone {
			t.Errorf("video %q has no driver", v)
		}
	}
	for _, d := range drivers {
		t.Run(d, func(t *testing.T) {
			if strings.Contains(string(out), "name \""+d+"\"") {
				return
			}
			if !env.caps.HasDevice(d) {
				t.Skipf("the host probe found QEMU %s has no device %q", env.caps.QEMU.Version, d)
			}
			t.Errorf("%s does not offer device %q, though the host probe found it", env.qemu, d)
		})
	}
}

// skipMissingDevices skips a golden whose argv has a device the host
// probe found this QEMU lacks; TestGoldenArgs checks the argv.
func skipMissingDevices(t *testing.T, argv []string, caps *hostcaps.Caps) {
	t.Helper()
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] != "-device" {
			continue
		}
		var dev struct {
			Driver string `json:"driver"`
		}
		if err := json.Unmarshal([]byte(argv[i+1]), &dev); err != nil || dev.Driver == "" {
			continue
		}
		if !caps.HasDevice(dev.Driver) {
			t.Skipf("the host probe found QEMU %s has no device %q; TestGoldenArgs checks the argv", caps.QEMU.Version, dev.Driver)
		}
	}
}

// hypervRefused is why this host's KVM cannot start a CPU with these
// enlightenments ("" if it can): a KVM without Hyper-V emulation refuses
// them (this project's PVM hosts: "kernel doesn't allow setting HyperV
// VP_INDEX", "failed to set MSR 0x40000021" for hv-time).
func hypervRefused(props []string) string {
	key := strings.Join(props, ",")
	hypervProbes.Lock()
	defer hypervProbes.Unlock()
	if why, ok := hypervProbes.m[key]; ok {
		return why
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testQEMU(), "-nodefaults", "-display", "none", "-S", "-accel", "kvm",
		"-cpu", "host,-arch-capabilities,"+key, "-qmp", "stdio")
	cmd.Stdin = strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n")
	out, err := cmd.CombinedOutput()
	why := ""
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		why = lines[len(lines)-1] + " (" + err.Error() + ")"
	}
	hypervProbes.m[key] = why
	return why
}

var hypervProbes = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

// skipHyperv skips a golden whose enlightenments this host's KVM refuses.
func skipHyperv(t *testing.T, vm *spec.VM, o Options) {
	props, err := hypervProps(vm, o.Accel)
	if err != nil || len(props) == 0 {
		return
	}
	if why := hypervRefused(props); why != "" {
		t.Skipf("hyperv: this host's KVM refuses %s: %s; TestGoldenArgs checks the argv", strings.Join(props, ","), why)
	}
}

// checkVNC: a VM with a VNC server serves it on its unix socket.
func checkVNC(q *rawQMP, o Options) error {
	if o.VNCSocket == "" {
		return nil
	}
	var vnc struct {
		Enabled bool
		Family  string
		Service string
		Auth    string
	}
	if err := q.run("query-vnc", nil, &vnc); err != nil {
		return err
	}
	if !vnc.Enabled || vnc.Family != "unix" || vnc.Service != o.VNCSocket {
		return &Error{Field: "display", Msg: "query-vnc: not serving on " + o.VNCSocket + ": " + vnc.Family + " " + vnc.Service}
	}
	return nil
}

// exampleCase is examples/windows.toml as a golden case: its argv golden
// is testdata/qemuargs/examples/windows.args, its relative paths resolve
// under /golden/ as a golden file's do.
func exampleCase(t *testing.T) goldenCase {
	data, err := os.ReadFile("../examples/windows.toml")
	if err != nil {
		t.Fatal(err)
	}
	// The example names its files in vmsup's image directory (where
	// validate takes them); the golden has them beside the file.
	data = bytes.ReplaceAll(data, []byte("/var/lib/vmsup/images/"), nil)
	return goldenCase{name: "windows", file: filepath.Join(goldenDir, "examples", "windows.toml"), data: data, override: map[string]string{}}
}

// TestWindowsExample: the Windows example renders its golden argv and
// starts in QEMU (-S) with its firmware (OVMF Secure Boot), its TPM (a
// real swtpm) and its installer and driver ISOs on SATA.
func TestWindowsExample(t *testing.T) {
	c := exampleCase(t)
	argv := checkGolden(t, c)
	for _, w := range []string{"smm=on", "OVMF_CODE_4M.secboot.fd", `"driver":"tpm-crb"`, "virtio-win.iso", "Win11_English_x64.iso", `"driver":"e1000e"`, "base=localtime", `"driver":"VGA"`, "-vnc"} {
		if !strings.Contains(strings.Join(argv, "\n"), w) {
			t.Errorf("argv lacks %s", w)
		}
	}
	env := needQEMU(t)
	argv, o := materialize(t, c, env, false) // checks it is the golden argv, paths mapped back
	if o.TPMSocket == "" || o.FirmwareCode == "" {
		t.Fatalf("no TPM socket or firmware: %+v", o)
	}
	checkInQEMU(t, argv, o)
	t.Logf("started in QEMU -S with %s and TPM %s", o.FirmwareCode, o.TPMSocket)
}
