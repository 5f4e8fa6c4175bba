package qemuargs

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/spec"
)

var update = flag.Bool("update", false, "rewrite testdata/qemuargs/*.args from Build's output")

// goldenDir holds NAME.toml -> NAME.args pairs (one argument per line), and
// errors/NAME.toml whose first line is "# error: SUBSTRING".
const goldenDir = "../testdata/qemuargs"

// goldenCase is one testdata/qemuargs TOML file.
type goldenCase struct {
	name string // file name without .toml
	file string // path of the .toml
	data []byte
	// override holds "# Options.FIELD: VALUE" header lines (VALUE may be a
	// Go-quoted string); wantErr the "# error: ..." line.
	override map[string]string
	wantErr  string
}

var headerRE = regexp.MustCompile(`^# (error|Options\.[A-Za-z]+):(?: (.*))?$`)

func loadCases(t *testing.T, dir string) []goldenCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.toml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files in %s: %v", dir, err)
	}
	var cases []goldenCase
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c := goldenCase{name: strings.TrimSuffix(filepath.Base(f), ".toml"), file: f, data: data, override: map[string]string{}}
		for _, line := range strings.Split(string(data), "\n") {
			m := headerRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			v := m[2]
			if strings.HasPrefix(v, `"`) {
				if v, err = strconv.Unquote(v); err != nil {
					t.Fatalf("%s: %q: %v", f, line, err)
				}
			}
			if m[1] == "error" {
				c.wantErr = v
				continue
			}
			c.override[strings.TrimPrefix(m[1], "Options.")] = v
		}
		cases = append(cases, c)
	}
	return cases
}

// parse parses the case as spec.Parse("/golden/"+base), so relative paths
// resolve to /golden/... wherever the repository is.
func (c goldenCase) parse() (*spec.File, error) {
	return spec.Parse("/golden/"+filepath.Base(c.file), c.data)
}

// options are the fixed Options of the golden tests, then the case's
// overrides. accel "auto" in the TOML resolves to tcg.
func (c goldenCase) options(t *testing.T, vm *spec.VM) Options {
	t.Helper()
	run := "/run/vmsup/" + vm.Name + "/"
	o := Options{
		Binary:        "/usr/bin/qemu-system-x86_64",
		Accel:         vm.Accel,
		QMPSocket:     run + "qmp.sock",
		EventSocket:   run + "qmp-events.sock",
		ConsoleSocket: run + "console.sock",
		ConsoleLog:    run + "console.log",
		EventLog:      run + "events",
		AgentSocket:   run + "guest-agent.sock",
		FirmwareVars:  run + "OVMF_VARS.fd",
	}
	if o.Accel == spec.AccelAuto {
		o.Accel = spec.AccelTCG
	}
	// Files vmsup prepares for some disks: a built seed, secret files.
	for _, d := range vm.Disks {
		var h DiskHost
		if d.Type == spec.DiskSeed {
			h.Image = run + "seed-" + d.Name + ".iso"
		}
		if d.NeedsSecret() {
			h.SecretFile = run + "secrets/" + d.Name
		}
		if h != (DiskHost{}) {
			if o.Disks == nil {
				o.Disks = map[string]DiskHost{}
			}
			o.Disks[d.Name] = h
		}
	}
	for _, name := range vm.CredentialNames() {
		if o.Credentials == nil {
			o.Credentials = map[string]string{}
		}
		o.Credentials[name] = run + "secrets/.credentials/" + name
	}
	if vm.TPM != nil {
		o.TPMSocket = run + "tpm/ctrl.sock"
	}
	if vm.Display.HasVNC() {
		o.VNCSocket = run + "vnc.sock"
	}
	for _, sh := range vm.Shares {
		if sh.Driver == spec.ShareVirtioFS {
			if o.ShareSockets == nil {
				o.ShareSockets = map[string]string{}
			}
			o.ShareSockets[sh.Tag] = run + "virtiofs-" + sh.Tag + ".sock"
		}
	}
	// What the supervisor allocates or finds: the CID (the file's, else
	// the first free one), the hugetlbfs mount of the page size.
	if vm.Vsock.On() {
		o.VsockCID = spec.MinVsockCID
		if vm.Vsock.CID != 0 {
			o.VsockCID = uint32(vm.Vsock.CID)
		}
	}
	switch vm.Hugepages {
	case spec.Hugepages2M:
		o.Hugetlbfs = "/dev/hugepages"
	case spec.Hugepages1G:
		o.Hugetlbfs = "/dev/hugepages1G"
	}
	switch vm.Boot.Firmware {
	case spec.FirmwareUEFI:
		o.FirmwareCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
		if vm.Boot.SecureBoot {
			o.FirmwareCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
		}
	case spec.FirmwareQboot:
		o.FirmwareCode = "/usr/share/qemu/qboot.rom"
	}
	fields := map[string]*string{
		"Binary": &o.Binary, "QMPSocket": &o.QMPSocket, "EventSocket": &o.EventSocket,
		"ConsoleSocket": &o.ConsoleSocket, "AgentSocket": &o.AgentSocket, "ConsoleLog": &o.ConsoleLog, "EventLog": &o.EventLog,
		"FirmwareCode": &o.FirmwareCode, "FirmwareVars": &o.FirmwareVars, "UUID": &o.UUID, "GenID": &o.GenID,
		"TPMSocket": &o.TPMSocket, "VNCSocket": &o.VNCSocket, "Machine": &o.Machine,
		"Hugetlbfs": &o.Hugetlbfs, "CPRSocket": &o.CPRSocket, "RAMID": &o.RAMID,
	}
	for k, v := range c.override {
		if k == "Accel" {
			o.Accel = spec.Accel(v)
			continue
		}
		if b, ok := map[string]*bool{"Incoming": &o.Incoming, "ShareRAM": &o.ShareRAM, "VhostNet": &o.VhostNet}[k]; ok {
			*b = v == "true"
			continue
		}
		if k == "DisksByFD" {
			o.DisksByFD, o.StateDir = v == "true", strings.TrimSuffix(run, "/")
			continue
		}
		if k == "CPUFeaturesOff" {
			o.CPUFeaturesOff = strings.Split(v, ",")
			continue
		}
		if k == "CPU" {
			o.CPU = v
			continue
		}
		if k == "VsockCID" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				t.Fatalf("%s: Options.VsockCID: %v", c.file, err)
			}
			o.VsockCID = uint32(n)
			continue
		}
		p, ok := fields[k]
		if !ok {
			t.Fatalf("%s: unknown header Options.%s", c.file, k)
		}
		*p = v
	}
	return o
}

func readArgs(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n"), nil
}

func TestGoldenArgs(t *testing.T) {
	cases := loadCases(t, goldenDir)
	if len(cases) < 24 {
		t.Errorf("only %d golden cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.wantErr != "" {
				t.Fatalf("%s: golden files must not have an error header; move it to errors/", c.file)
			}
			checkGolden(t, c)
		})
	}
}

// checkGolden builds the case's argv and compares it with its .args file
// (rewritten with -update), and checks Build is deterministic.
func checkGolden(t *testing.T, c goldenCase) []string {
	t.Helper()
	f, err := c.parse()
	if err != nil {
		t.Fatalf("spec.Parse: %v", err)
	}
	argv, err := Build(&f.VM, c.options(t, &f.VM))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	argsFile := strings.TrimSuffix(c.file, ".toml") + ".args"
	if *update {
		if err := os.WriteFile(argsFile, []byte(strings.Join(argv, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return argv
	}
	want, err := readArgs(argsFile)
	if err != nil {
		t.Fatalf("%v (run go test ./qemuargs -update to create it)", err)
	}
	if diff := cmp.Diff(want, argv); diff != "" {
		t.Errorf("Build(%s) mismatch (-%s +got); rerun with -update if intended:\n%s", c.file, filepath.Base(argsFile), diff)
	}
	again, _ := Build(&f.VM, c.options(t, &f.VM))
	if !cmp.Equal(argv, again) {
		t.Errorf("Build is not deterministic")
	}
	return argv
}

// TestGoldenArgsNoOrphans finds .args files whose .toml is gone.
func TestGoldenArgsNoOrphans(t *testing.T) {
	args, _ := filepath.Glob(filepath.Join(goldenDir, "*.args"))
	for _, a := range args {
		if _, err := os.Stat(strings.TrimSuffix(a, ".args") + ".toml"); err != nil {
			t.Errorf("%s has no .toml", a)
		}
	}
}

func TestGoldenErrors(t *testing.T) {
	cases := loadCases(t, filepath.Join(goldenDir, "errors"))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.wantErr == "" {
				t.Fatalf("%s: first line must be \"# error: SUBSTRING\"", c.file)
			}
			f, err := c.parse()
			if err == nil {
				var argv []string
				argv, err = Build(&f.VM, c.options(t, &f.VM))
				if err == nil {
					t.Fatalf("Build succeeded, want error containing %q; argv:\n%s", c.wantErr, strings.Join(argv, "\n"))
				}
				var e *Error
				if !errors.As(err, &e) {
					t.Errorf("Build error %T is not a *qemuargs.Error", err)
				} else if e.VM != f.VM.Name {
					t.Errorf("Build error names vm %q, want %q", e.VM, f.VM.Name)
				}
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q\ndoes not contain %q", err, c.wantErr)
			}
		})
	}
}
