package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// TestCLIBadInput: every broken input gives one line on stderr naming the
// file:line:col or field, a non-zero exit, nothing started, nothing
// overwritten (including a running VM's recorded spec).
func TestCLIBadInput(t *testing.T) {
	root := t.TempDir()
	dir := t.TempDir()
	good := write(t, dir, "keep.toml", strings.Replace(guestTOML("keep", ""), `stop_timeout = "20s"`, `stop_timeout = "2s"`, 1))
	if r := vmsup(t, root, "", "up", good); r.code != 0 {
		t.Fatalf("up keep: %+v", r)
	}
	defer vmsup(t, root, "", "down", "keep")
	keepSpec := filepath.Join(root, "records", "keep", "spec.toml")
	before, err := os.ReadFile(keepSpec)
	if err != nil {
		t.Fatal(err)
	}
	unitsBefore := vmsupUnits(t)

	k, i := env.Guest.Kernel, env.Guest.Initrd
	gone := filepath.Join(dir, "nonexistent")      // in a place the tests allow: missing, not refused
	held, err := net.Listen("tcp4", "127.0.0.1:0") // a host port something else holds
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	cases := []struct {
		name, file, body string
		args             []string // default: up FILE
		want             string
	}{
		{name: "unknown key", file: "a.toml", body: "name='a'\nmemory='256M'\ncolour='blue'\n[boot]\nkernel='" + k + "'\n", want: "a.toml:3:1: colour: unknown key"},
		{name: "wrong type", file: "b.toml", body: "name='b'\nmemory='256M'\ncpus='two'\n[boot]\nkernel='" + k + "'\n", want: "b.toml:3:6: cpus:"},
		{name: "negative memory", file: "c.toml", body: "name='c'\nmemory='-1G'\n[boot]\nkernel='" + k + "'\n", want: "c.toml:2:8: memory: negative size"},
		{name: "memory above host RAM", file: "d.toml", body: "name='d'\nmemory='64T'\n[boot]\nkernel='" + k + "'\n", want: "d.toml:2:1: memory: 64T is more than this host's RAM"},
		{name: "missing kernel", file: "e.toml", body: "name='e'\nmemory='256M'\n[boot]\nkernel='" + gone + "/vmlinux'\n", want: "e.toml:4:1: boot.kernel: " + gone + "/vmlinux: no such file"},
		{name: "missing initrd", file: "f.toml", body: "name='f'\nmemory='256M'\n[boot]\nkernel='" + k + "'\ninitrd='nope.img'\n", want: "f.toml:5:1: boot.initrd:"},
		{name: "missing disk", file: "g.toml", body: "name='g'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n[[disk]]\nname='root'\nfile='" + gone + "/root.qcow2'\n", want: "g.toml:7:1: disk[0].file: disk \"root\": " + gone + "/root.qcow2: no such file"},
		{name: "kernel is a directory", file: "h.toml", body: "name='h'\nmemory='256M'\n[boot]\nkernel='/tmp'\n", want: "boot.kernel: /tmp is a directory"},
		{name: "slash in name", file: "i.toml", body: "name='../etc'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n", want: "i.toml:1:1: name:"},
		{name: "dotdot in name", file: "j.toml", body: "name='a..b'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n", want: "name: name \"a..b\" contains \"..\""},
		{name: "name with space", file: "k.toml", body: "name='a b'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n", want: "k.toml:1:1: name:"},
		{name: "no memory", file: "l.toml", body: "name='l'\n[boot]\nkernel='" + k + "'\n", want: "l.toml:1:1: memory: missing"},
		{name: "syntax error", file: "m.toml", body: "name='m\n", want: "m.toml:1:"},
		{name: "bad accel", file: "n.toml", body: "name='n'\nmemory='256M'\naccel='hvf'\n[boot]\nkernel='" + k + "'\n", want: "n.toml:3:1: accel: unknown accelerator"},
		{name: "bad disk cache", file: "o.toml", body: "name='o'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n[[disk]]\nname='d'\nfile='" + i + "'\ncache='turbo'\n", want: "o.toml:8:1: disk[0].cache"},
		{name: "duplicate disk names", file: "p.toml", body: "name='p'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n[[disk]]\nname='d'\nfile='" + i + "'\n[[disk]]\nname='d'\nfile='" + i + "'\n", want: "p.toml:9:1: disk[1].name: duplicate disk name"},
		{name: "duplicate MAC", file: "q.toml", body: "name='q'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n[[nic]]\nname='a'\nmac='52:54:00:12:34:56'\n[[nic]]\nname='b'\nmac='52:54:00:12:34:56'\n", want: "q.toml:10:1: nic[1].mac: nic \"b\": duplicate MAC"},
		{name: "bad duration", file: "r.toml", body: "name='r'\nmemory='256M'\nstop_timeout='forever'\n[boot]\nkernel='" + k + "'\n", want: "r.toml:3:14: stop_timeout: invalid duration"},
		{name: "file does not exist", args: []string{"up", "/nonexistent/vm.toml"}, want: "vmsup: /nonexistent/vm.toml: no such file or directory"},
		{name: "bare number duration", file: "u2.toml", body: "name='u'\nmemory='256M'\nstop_timeout=30\n[boot]\nkernel='" + k + "'\n", want: `u2.toml:3:1: stop_timeout: a bare number has no unit: write "30s" for seconds`},
		{name: "same forward twice", file: "v.toml", body: "name='v'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n[[nic]]\nname='a'\nforwards=['tcp:127.0.0.1:2222-:22']\n[[nic]]\nname='b'\nforwards=['tcp:127.0.0.1:2222-:80']\n",
			want: "v.toml:10:1: nic[1].forwards[0]: host port 2222/tcp is already forwarded by nic[0].forwards[0]"},
		{name: "forward port taken", file: "w2.toml", body: "name='w2'\nmemory='256M'\n[boot]\nkernel='" + k + "'\n[[nic]]\nname='a'\nforwards=['tcp:127.0.0.1:" + fmt.Sprint(taken) + "-:22']\n",
			args: []string{"validate", "@w2.toml"}, want: "w2.toml:7:1: nic[0].forwards[0]: host port " + fmt.Sprint(taken) + "/tcp is in use on this host (QEMU could not bind it)"},
		{name: "did you mean", file: "x2.toml", body: "name='x2'\nmemry='256M'\n[boot]\nkernel='" + k + "'\n", args: []string{"validate", "@x2.toml"}, want: `x2.toml:2:1: memry: unknown key; did you mean "memory"?`},
		{name: "pause of unknown VM", args: []string{"pause", "nosuch"}, want: `vm "nosuch": no such VM`},
		{name: "duplicate names across files", file: "s.toml", body: guestTOML("keep", "cpus = 2"), args: []string{"up", good, "@s.toml"}, want: "s.toml:1:1: name: VM \"keep\" is also defined in " + good},
		{name: "same name as running VM, broken", file: "t.toml", body: "name='keep'\nmemory='256M'\nbogus=1\n[boot]\nkernel='" + k + "'\n", want: "t.toml:3:1: bogus: unknown key"},
		{name: "status of unknown VM", args: []string{"status", "nosuch"}, want: `vm "nosuch": no such VM`},
		{name: "down with bad name", args: []string{"down", "a,b"}, want: `vm "a,b": name "a,b" may only contain`},
		{name: "enable a broken file", file: "u.toml", body: "name='u'\nmemory='256M'\ncolour='blue'\n[boot]\nkernel='" + k + "'\n", args: []string{"enable", "@u.toml"}, want: "u.toml:3:1: colour: unknown key"},
		{name: "enable a file whose kernel is gone", file: "v.toml", body: "name='v'\nmemory='256M'\n[boot]\nkernel='" + gone + "/vmlinux'\n", args: []string{"enable", "@v.toml"}, want: "v.toml:4:1: boot.kernel: " + gone + "/vmlinux: no such file"},
		{name: "disable with bad name", args: []string{"disable", "a,b"}, want: `vm "a,b": name "a,b" may only contain`},
		{name: "set with nothing to set", args: []string{"set", "keep"}, want: "nothing to set: give --cpus, --memory, --cpu-quota or --cpu-weight"},
		{name: "set above max_cpus", args: []string{"set", "keep", "--cpus", "9"}, want: `vm "keep": set: cpus 9 is above max_cpus 1`},
		{name: "set a bad size", args: []string{"set", "keep", "--memory", "lots"}, want: `--memory: invalid size "lots"`},
		{name: "set a VM that is not running", args: []string{"set", "nosuch", "--cpus", "2"}, want: `vm "nosuch": set:`},
		{name: "rm a running VM", args: []string{"rm", "keep"}, want: `vm "keep": it is active (unit vmsup-keep.service); vmsup down it first`},
		{name: "rm an unknown VM", args: []string{"rm", "nosuch"}, want: `vm "nosuch": no such VM`},
		{name: "unknown flag", args: []string{"up", "--frobnicate"}, want: "unknown flag: --frobnicate"},
		{name: "no systemd on the bus", args: []string{"--systemd-bus", "unix:path=/nonexistent/bus", "ls"}, want: "no systemd answers on unix:path=/nonexistent/bus"},
		{name: "qmp to a VM that is not running", args: []string{"qmp", "nosuch", `{"execute":"query-status"}`}, want: `vm "nosuch"`},
		{name: "CPU model QEMU lacks", file: "w.toml", body: "name='w'\nmemory='256M'\naccel='tcg'\ncpu_model='nosuchcpu'\n[boot]\nkernel='" + k + "'\n",
			args: []string{"validate", "@w.toml"}, want: `w.toml:4:1: cpu_model: QEMU ` + env.Caps.QEMU.Version + ` has no CPU model "nosuchcpu"; these would: max`},
	}
	if ok, why := env.Caps.KVM.Starts(); !ok {
		// What does not work here, and what would.
		cases = append(cases, struct {
			name, file, body string
			args             []string
			want             string
		}{name: "kvm where KVM does not start", file: "x.toml", body: "name='x'\nmemory='256M'\naccel='kvm'\n[boot]\nkernel='" + k + "'\n",
			args: []string{"validate", "@x.toml"}, want: "x.toml:3:1: accel: kvm requested but " + why + "; accel = \"tcg\" runs it emulated"})
	} else {
		t.Logf("KVM starts here: the \"kvm where KVM does not start\" row cannot happen (probe: %s)", env.Caps.KVM.Kind)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			var path string
			if c.file != "" {
				path = write(t, dir, c.file, c.body)
			}
			if args == nil {
				args = []string{"up", path}
			}
			for j, a := range args {
				if strings.HasPrefix(a, "@") {
					args[j] = filepath.Join(dir, a[1:])
				}
			}
			r := vmsup(t, root, "", args...)
			if r.code == 0 {
				t.Fatalf("exit 0 for %v: %+v", args, r)
			}
			line := strings.TrimSuffix(r.stderr, "\n")
			if strings.Contains(line, "\n") || !strings.HasPrefix(line, "vmsup: ") {
				t.Fatalf("stderr is not one 'vmsup: ' line: %q", r.stderr)
			}
			if !strings.Contains(line, c.want) {
				t.Fatalf("stderr %q does not contain %q", line, c.want)
			}
		})
	}
	if after, _ := os.ReadFile(keepSpec); string(after) != string(before) {
		t.Fatalf("a failed command overwrote the running VM's spec")
	}
	if got := vmsupUnits(t); got != unitsBefore {
		t.Fatalf("units changed by failed commands:\nbefore %s\nafter  %s", unitsBefore, got)
	}
	for _, d := range []string{"vms", "records"} {
		ents, _ := os.ReadDir(filepath.Join(root, d))
		for _, e := range ents {
			if e.IsDir() && e.Name() != "keep" {
				t.Fatalf("a failed command left %s/%s", d, e.Name())
			}
		}
	}
	for _, d := range []string{"autostart", "etc-systemd"} {
		if ents, _ := os.ReadDir(filepath.Join(root, d)); len(ents) != 0 {
			t.Fatalf("a failed enable left %s/%s", d, ents[0].Name())
		}
	}
}

// TestCLIEndToEnd drives a real guest through the CLI as a user would.
func TestCLIEndToEnd(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	file := write(t, dir, "demo.toml", guestTOML("demo", "[[nic]]\nname = \"net0\"\nforwards = [\"tcp:127.0.0.1:0-:22\"]\n"))
	if r := vmsup(t, root, "", "validate", file); r.code != 0 || !strings.Contains(r.stdout, "ok") {
		t.Fatalf("validate: %+v", r)
	}
	r := vmsup(t, root, "", "argv", file)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "/usr/bin/qemu-system-x86_64\n") || !strings.Contains(r.stdout, "\n-accel\ntcg,split-wx=on,tb-size=128\n") {
		t.Fatalf("argv: %+v", r)
	}
	if r := vmsup(t, root, "", "up", file); r.code != 0 || !strings.Contains(r.stdout, "demo: started (accel tcg)") {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "down", "demo")
	if r := vmsup(t, root, "", "up", file); r.code != 0 || !strings.Contains(r.stdout, "demo: unchanged") {
		t.Fatalf("second up: %+v", r)
	}
	var st struct {
		State, Accel string
		ConsoleLog   string `json:"console_log"`
	}
	r = vmsup(t, root, "", "status", "--json", "demo")
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.State != "running" || st.Accel != "tcg" {
		t.Fatalf("status --json: %+v %v", r, err)
	}
	waitFor(t, st.ConsoleLog, "VMSUP-SHELL-READY", time.Minute)
	// status says how QEMU is confined (the exposure needs systemd-analyze
	// inside the sandbox, so it may be "unknown" here).
	if r := vmsup(t, root, "", "status", "demo"); !strings.Contains(r.stdout, "confined: user vmsupq-") ||
		!strings.Contains(r.stdout, "seccomp qemu -sandbox on") {
		t.Fatalf("status lacks the confinement: %+v", r)
	}
	// The guest ping: the test guest starts qemu-ga as it comes up (until
	// then, ping says the guest has not opened the agent channel).
	r = vmsup(t, root, "", "ping", "demo")
	for deadline := time.Now().Add(20 * time.Second); r.code != 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if !strings.Contains(r.stderr, "has not opened the agent channel") {
			break
		}
		r = vmsup(t, root, "", "ping", "demo")
	}
	if r.code != 0 || !strings.Contains(r.stdout, "demo: qemu-ga 7.2") || !strings.Contains(r.stdout, "responding in") {
		t.Fatalf("ping: %+v", r)
	}
	if r := vmsup(t, root, "", "status", "demo"); !strings.Contains(r.stdout, "agent:    qemu-ga 7.2") {
		t.Fatalf("status lacks the guest ping: %+v", r)
	}

	// A changed file is reported, not applied.
	changed := write(t, dir, "demo.toml", guestTOML("demo", "cpus = 2\n[[nic]]\nname = \"net0\"\nforwards = [\"tcp:127.0.0.1:0-:22\"]\n"))
	if r := vmsup(t, root, "", "up", changed); r.code != 0 || !strings.Contains(r.stdout, "demo: changed") {
		t.Fatalf("up of a changed file: %+v", r)
	}

	r = vmsup(t, root, "echo vmsup-$((6*7))\n", "console", "demo")
	if !strings.Contains(r.stdout, "vmsup-42") {
		t.Fatalf("console did not echo: %+v", r)
	}
	r = vmsup(t, root, "", "qmp", "demo", `{"execute":"query-status"}`)
	if r.code != 0 || !strings.Contains(r.stdout, `"status":"running"`) {
		t.Fatalf("qmp: %+v", r)
	}
	if r := vmsup(t, root, "", "qmp", "demo", `{"execute":"no-such-command"}`); r.code == 0 || !strings.Contains(r.stderr, "not on the allow-list") {
		t.Fatalf("qmp of a command off the allow-list: %+v", r)
	}
	if r := vmsup(t, root, "", "qmp", "--unsafe", "demo", `{"execute":"no-such-command"}`); r.code == 0 || !strings.Contains(r.stderr, "CommandNotFound") {
		t.Fatalf("qmp error: %+v", r)
	}
	if r := vmsup(t, root, "", "pause", "demo"); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}
	if r := vmsup(t, root, "", "status", "demo"); !strings.Contains(r.stdout, "state:    paused") {
		t.Fatalf("status after pause: %+v", r)
	}
	// A paused guest's agent cannot answer: ping says so at once.
	if r := vmsup(t, root, "", "ping", "demo"); r.code != 1 || !strings.Contains(r.stderr, `vm "demo": paused: the guest agent cannot answer while the VM is paused`) {
		t.Fatalf("ping of a paused guest: %+v", r)
	}
	if r := vmsup(t, root, "", "resume", "demo"); r.code != 0 {
		t.Fatalf("resume: %+v", r)
	}
	r = vmsup(t, root, "", "ls", "--json")
	var list []struct{ Name, State string }
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].State != "running" {
		t.Fatalf("ls --json: %+v %v", r, err)
	}
	if r := vmsup(t, root, "", "ls"); !strings.Contains(r.stdout, "demo") || !strings.Contains(r.stdout, "running") {
		t.Fatalf("ls: %+v", r)
	}

	// Autostart: enable marks it and installs the boot unit; what the boot
	// unit runs brings it up once per boot (TestAutostart reboots for real).
	if r := vmsup(t, root, "", "enable", changed); r.code != 0 || r.stdout != "demo: enabled (starts at boot from "+changed+")\n" {
		t.Fatalf("enable: %+v", r)
	}
	bootUnit := filepath.Join(root, "etc-systemd", "vmsup.service")
	if b, err := os.ReadFile(bootUnit); err != nil || !strings.Contains(string(b), " autostart\n") {
		t.Fatalf("boot unit: %v\n%s", err, b)
	}
	if r := vmsup(t, root, "", "ls"); !strings.Contains(r.stdout, "BOOT") || !strings.Contains(r.stdout, "enabled") {
		t.Fatalf("ls after enable: %+v", r)
	}
	if r := vmsup(t, root, "", "autostart"); r.code != 0 || !strings.Contains(r.stdout, "demo: changed") {
		t.Fatalf("autostart: %+v", r)
	}
	if r := vmsup(t, root, "", "autostart"); r.code != 0 || !strings.Contains(r.stdout, "already started once this boot") {
		t.Fatalf("second autostart: %+v", r)
	}
	r = vmsup(t, root, "", "down", file)
	if r.code != 0 || !strings.Contains(r.stdout, "demo: guest powered off (ACPI)") {
		t.Fatalf("down: %+v", r)
	}
	if r := vmsup(t, root, "", "status", "demo"); !strings.Contains(r.stdout, "state:    shut off") || !strings.Contains(r.stdout, "boot:     enabled") {
		t.Fatalf("status after down: %+v", r)
	}
	if r := vmsup(t, root, "", "disable", "demo"); r.code != 0 || r.stdout != "demo: disabled\n" {
		t.Fatalf("disable: %+v", r)
	}
	if _, err := os.Stat(bootUnit); !os.IsNotExist(err) {
		t.Fatalf("boot unit left after the last VM was disabled: %v", err)
	}
}

func waitFor(t *testing.T, path, marker string, d time.Duration) {
	t.Helper()
	testenv.WaitLog(t, path, marker, d)
}

// TestCLIHost: vmsup host prints the probe's record with a reason for every
// "no", from the cache the second time; --json has the whole record.
func TestCLIHost(t *testing.T) {
	root := t.TempDir()
	r := vmsup(t, root, "", "--host-cache", filepath.Join(root, "hc.json"), "host", "--refresh")
	if r.code != 0 || !strings.Contains(r.stdout, "qemu:        "+env.QEMU) || !strings.Contains(r.stdout, "kvm:         ") ||
		!strings.Contains(r.stdout, "accel auto:  ") || !strings.Contains(r.stdout, "helpers:     ") {
		t.Fatalf("vmsup host: %+v", r)
	}
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.Contains(l, ": no") && !strings.Contains(l, "no: ") && !strings.Contains(l, "starts: no: ") {
			t.Errorf("a no without its reason: %q", l)
		}
	}
	t.Logf("vmsup host:\n%s", r.stdout)
	checkHostVersion(t, r.stdout)
	r = vmsup(t, root, "", "--host-cache", filepath.Join(root, "hc.json"), "host")
	if r.code != 0 || !strings.Contains(r.stdout, "read from the cache in") {
		t.Fatalf("second vmsup host: %+v", r)
	}
	r = vmsup(t, root, "", "--host-cache", filepath.Join(root, "hc.json"), "host", "--json")
	var rec struct {
		QEMU struct{ Version string }
		KVM  struct{ Kind string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &rec); err != nil || rec.QEMU.Version == "" || rec.KVM.Kind == "" {
		t.Fatalf("vmsup host --json: %v: %s", err, r.stdout)
	}
}

// TestCLIValidateAll: validate reports every file and every error of
// each, in file order, and says how many files failed.
func TestCLIValidateAll(t *testing.T) {
	dir := t.TempDir()
	k := env.Guest.Kernel
	a := write(t, dir, "a.toml", "name='a'\nmemory='8M'\nmachine='pcx'\n[boot]\nkernel='"+k+"'\n")
	b := write(t, dir, "b.toml", "name='b'\nmemory='256M'\n[boot]\nkernel='"+k+"'\n")
	c := write(t, dir, "c.toml", "name='c'\nmemry='256M'\nkernel='/k'\n")
	r := vmsup(t, t.TempDir(), "", "validate", a, b, c)
	want := "vmsup: " + a + ":2:1: memory: 8M is below the minimum of 16M\n" +
		"vmsup: " + a + ":3:1: machine: unknown machine \"pcx\" (want \"q35\", \"pc\", or a versioned pc-q35-X.Y or pc-i440fx-X.Y)\n" +
		"vmsup: " + c + ":2:1: memry: unknown key; did you mean \"memory\"?\n" +
		"vmsup: " + c + ":3:1: kernel: unknown key here; \"kernel\" belongs in [boot]\n" +
		"vmsup: 2 of 3 files have errors\n"
	if r.code != 1 || r.stderr != want || r.stdout != b+": ok (vm \"b\")\n" {
		t.Fatalf("validate a b c: %+v\nwant stderr:\n%s", r, want)
	}
	// A relative path resolves against the file's directory, wherever vmsup
	// runs (to the guest's kernel itself: a boot file is opened by its own
	// name, never through a symlink).
	rel, err := filepath.Rel(dir, k)
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "rel.toml", "name='rel'\nmemory='256M'\n[boot]\nkernel='"+rel+"'\n")
	cmd := exec.Command(vmsupBin, "validate", "rel.toml")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VMSUP_ROOT="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "rel.toml: ok") {
		t.Fatalf("validate rel.toml from its directory: %v\n%s", err, out)
	}
}
