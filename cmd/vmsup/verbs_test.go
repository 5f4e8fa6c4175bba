package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCLIVerbs: the lifecycle verbs on one real guest (with qemu-ga):
// reboot by the agent and by ACPI and reset keep the same QEMU (the guest
// boots again: its marker is seen once more each time), restart gives a new
// one, down --timeout waits with progress then quits a guest that ignores
// the button (paused), down --force quits at once, kill ends it now.
func TestCLIVerbs(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	body := strings.Replace(guestTOML("verbs", "description = \"the verbs test\"\n"+
		"[[disk]]\nname = \"data\"\nfile = \""+dir+"/data.qcow2\"\nsize = \"16M\"\n"+
		"[[nic]]\nname = \"net0\"\nforwards = [\"tcp:127.0.0.1:0-:22\"]\n"),
		`cmdline = "console=ttyS0 no_timer_check"`, `cmdline = "console=ttyS0 no_timer_check vmsup.dhcp"`, 1)
	file := write(t, dir, "verbs.toml", body)
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "kill", "verbs")
	st := cliStatus(t, root, "verbs")
	const ready = "VMSUP-SHELL-READY"
	waitCount(t, st.ConsoleLog, ready, 1)
	pid := st.MainPID
	waitAgent(t, root, "verbs")
	guestTools(t, root, dir)
	cliPlanApply(t, root, dir, file, body)
	cliOwner(t, root, file, body)

	for i, c := range []struct {
		args []string
		want string
	}{
		{[]string{"reboot", "verbs"}, "verbs: rebooted (agent)\n"},
		{[]string{"reboot", "--mode", "acpi", "verbs"}, "verbs: rebooted (acpi)\n"},
		{[]string{"reset", "verbs"}, "verbs: reset\n"},
	} {
		r := vmsup(t, root, "", c.args...)
		if r.code != 0 || r.stdout != c.want {
			t.Fatalf("%v: %+v", c.args, r)
		}
		waitCount(t, st.ConsoleLog, ready, i+2)
		if got := cliStatus(t, root, "verbs"); got.MainPID != pid || got.State != "running" {
			t.Fatalf("after %v: pid %d state %s, want pid %d running", c.args, got.MainPID, got.State, pid)
		}
		if c.args[0] == "reboot" {
			waitAgent(t, root, "verbs") // the next reboot's agent path needs it up again
		}
	}
	// The ACPI reboot gave QEMU its poweroff action back: a later guest
	// poweroff ends the VM, it does not leave it paused.
	if r := vmsup(t, root, "", "qmp", "verbs", `{"execute":"query-status"}`); !strings.Contains(r.stdout, `"running"`) {
		t.Fatalf("status after the reboots: %+v", r)
	}

	r := vmsup(t, root, "", "restart", "verbs")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "verbs: restarted") {
		t.Fatalf("restart: %+v", r)
	}
	st = cliStatus(t, root, "verbs")
	if st.MainPID == pid || st.State != "running" {
		t.Fatalf("after restart: pid %d (was %d), %s", st.MainPID, pid, st.State)
	}
	waitCount(t, st.ConsoleLog, ready, 1) // a new QEMU starts a new log

	// A paused guest cannot answer the button: down waits, says so, quits.
	if r := vmsup(t, root, "", "pause", "verbs"); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}
	if r := vmsup(t, root, "", "reboot", "--mode", "acpi", "verbs"); r.code != 1 || !strings.Contains(r.stderr, "QEMU is paused: resume it first") {
		t.Fatalf("reboot of a paused guest: %+v", r)
	}
	r = vmsup(t, root, "", "down", "--timeout", "3s", "verbs")
	if r.code != 0 || !strings.Contains(r.stdout, "verbs: QEMU quit") ||
		!strings.Contains(r.stderr, "verbs: waiting for the guest to power off (1s of 3s)…") {
		t.Fatalf("down --timeout of a paused guest: %+v", r)
	}
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	start := time.Now()
	if r := vmsup(t, root, "", "down", "--force", "verbs"); r.code != 0 || !strings.Contains(r.stdout, "verbs: QEMU quit") {
		t.Fatalf("down --force: %+v", r)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("down --force took %v", d)
	}
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	if r := vmsup(t, root, "", "kill", "verbs"); r.code != 0 || !strings.Contains(r.stdout, "verbs: QEMU killed") {
		t.Fatalf("kill: %+v", r)
	}
	if st := cliStatus(t, root, "verbs"); st.State != "shut-off" {
		t.Fatalf("after kill: %s", st.State)
	}
	// The verbs on what is not there: documented exit codes.
	for _, args := range [][]string{{"reboot", "verbs"}, {"reset", "verbs"}, {"pause", "verbs"}} {
		if r := vmsup(t, root, "", args...); r.code != 5 || !strings.Contains(r.stderr, `vm "verbs": not running`) {
			t.Errorf("%v of a shut-off VM: %+v, want exit 5", args, r)
		}
	}
	for _, args := range [][]string{{"reboot", "nosuch"}, {"pause", "nosuch"}, {"down", "nosuch"}, {"kill", "nosuch"}, {"restart", "nosuch"}, {"console", "nosuch"}} {
		if r := vmsup(t, root, "", args...); r.code != 3 || !strings.Contains(r.stderr, `vm "nosuch": no such VM`) {
			t.Errorf("%v: %+v, want exit 3 and one wording", args, r)
		}
	}
}

// cliOwner: a second file naming TestCLIVerbs's running VM does not take
// it over: up, plan and apply of it fail (exit 1) naming both files and
// change nothing; ls shows the file the VM belongs to; the VM's name stands
// for its file; --adopt hands the VM over (and back).
func cliOwner(t *testing.T, root, file, body string) {
	t.Helper()
	other := write(t, t.TempDir(), "other.toml", strings.Replace(body, `[[disk]]
name = "data"`, `[[disk]]
name = "gone"`, 1))
	for _, verb := range []string{"up", "plan", "apply"} {
		r := vmsup(t, root, "", verb, other)
		if r.code != 1 || !strings.Contains(r.stderr, `vm "verbs" belongs to `+file+", not to "+other) || !strings.Contains(r.stderr, "--adopt") {
			t.Fatalf("%s of another file naming the VM: %+v", verb, r)
		}
	}
	if st := cliStatus(t, root, "verbs"); len(st.Disks) == 0 || st.Disks[0].Name != "data" {
		t.Fatalf("the other file changed the VM: %+v", st.Disks)
	}
	if r := vmsup(t, root, "", "ls"); !strings.Contains(r.stdout, file) {
		t.Errorf("ls does not show the VM's file %s:\n%s", file, r.stdout)
	}
	if r := vmsup(t, root, "", "plan", "verbs"); r.code != 0 || r.stdout != "verbs: in sync with "+file+"\n" {
		t.Errorf("plan NAME: %+v", r)
	}
	if r := vmsup(t, root, "", "plan", "--adopt", other); r.code != 0 || !strings.Contains(r.stdout, "disk[gone]") {
		t.Errorf("plan --adopt: %+v", r)
	}
	if r := vmsup(t, root, "", "up", "--adopt", file); r.code != 0 {
		t.Errorf("up --adopt of the VM's own file: %+v", r)
	}
	// Another VM on verbs' image: refused, naming the VM that holds it.
	thief := write(t, t.TempDir(), "thief.toml", strings.Replace(body, `name = "verbs"`, `name = "thief"`, 1))
	for _, verb := range []string{"validate", "up"} {
		if r := vmsup(t, root, "", verb, thief); r.code != 1 || !strings.Contains(r.stderr, `image is in use by another process: VM "verbs" has it open (its disk "data")`) {
			t.Errorf("%s of a VM on another VM's image: %+v", verb, r)
		}
	}
}

type cliSt struct {
	State      string
	MainPID    uint32 `json:"main_pid"`
	ConsoleLog string `json:"console_log"`
	Disks      []struct{ Name string }
}

func cliStatus(t *testing.T, root, name string) cliSt {
	t.Helper()
	r := vmsup(t, root, "", "status", "--json", name)
	var st cliSt
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %+v: %v", r, err)
	}
	return st
}

// waitCount waits until marker appears n times in the log at path.
func waitCount(t *testing.T, path, marker string, n int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if c := strings.Count(string(b), marker); c >= n {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%s: %q seen %d times, want %d; log ends:\n%s", path, marker, c, n, tail(string(b), 2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitAgent waits until the guest's qemu-ga answers.
func waitAgent(t *testing.T, root, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := vmsup(t, root, "", "ping", name)
		if r.code == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest agent never answered: %+v", r)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// guestTools: exec, cp both ways, logs, and what status, ls, disk ls and
// nic ls show of a running guest with a disk, a user NIC and an agent.
func guestTools(t *testing.T, root, dir string) {
	r := vmsup(t, root, "", "exec", "verbs", "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 7")
	if r.code != 7 || r.stdout != "out\n" || !strings.Contains(r.stderr, "err\n") {
		t.Fatalf("exec: %+v, want exit 7, out, err", r)
	}
	if r := vmsup(t, root, "", "exec", "verbs", "/bin/true"); r.code != 2 {
		t.Errorf("exec without --: %+v, want usage exit 2", r)
	}
	data := make([]byte, 5<<20+123) // two chunks and a bit
	rand.Read(data)
	src := write(t, dir, "in.bin", string(data))
	if r := vmsup(t, root, "", "cp", src, "verbs:/tmp/in.bin"); r.code != 0 {
		t.Fatalf("cp to the guest: %+v", r)
	}
	sum := fmt.Sprintf("%x", sha256.Sum256(data))
	if r := vmsup(t, root, "", "exec", "verbs", "--", "sha256sum", "/tmp/in.bin"); r.code != 0 || !strings.HasPrefix(r.stdout, sum) {
		t.Fatalf("guest's checksum: %+v, want %s", r, sum)
	}
	back := dir + "/back.bin"
	if r := vmsup(t, root, "", "cp", "verbs:/tmp/in.bin", back); r.code != 0 {
		t.Fatalf("cp from the guest: %+v", r)
	}
	if b, err := os.ReadFile(back); err != nil || fmt.Sprintf("%x", sha256.Sum256(b)) != sum {
		t.Fatalf("copied back: %d bytes, %v: checksum differs", len(b), err)
	}
	if r := vmsup(t, root, "", "cp", "--max", "1000", "verbs:/tmp/in.bin", dir+"/small.bin"); r.code == 0 || !strings.Contains(r.stderr, "larger than 1000 bytes") {
		t.Errorf("cp over --max: %+v", r)
	}
	if _, err := os.Stat(dir + "/small.bin"); !os.IsNotExist(err) {
		t.Errorf("a refused copy left its file: %v", err)
	}

	// The guest's address comes from its agent once DHCP gave it one.
	var r2 result
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		r2 = vmsup(t, root, "", "status", "verbs")
		if strings.Contains(r2.stdout, "ip:       10.0.2.15/24 on eth0") || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{"ip:       10.0.2.15/24 on eth0", "about:    the verbs test", "disk:     data file " + dir + "/data.qcow2 (qcow2)",
		"nic:      net0 user mac 52:54:00:", "forwards tcp:127.0.0.1:0-:22", "(up "} {
		if !strings.Contains(r2.stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, r2.stdout)
		}
	}
	r = vmsup(t, root, "", "ls")
	if !strings.Contains(r.stdout, "IPV4") || !strings.Contains(r.stdout, "10.0.2.15/24 (eth0)") || !strings.Contains(r.stdout, "127.0.0.1:0->22/tcp") {
		t.Errorf("ls: %+v", r)
	}
	if r := vmsup(t, root, "", "disk", "ls", "verbs"); r.code != 0 || !strings.Contains(r.stdout, "data") || !strings.Contains(r.stdout, dir+"/data.qcow2") {
		t.Errorf("disk ls: %+v", r)
	}
	if r := vmsup(t, root, "", "nic", "ls", "verbs"); r.code != 0 || !strings.Contains(r.stdout, "net0") || !strings.Contains(r.stdout, "52:54:00:") {
		t.Errorf("nic ls: %+v", r)
	}
	r = vmsup(t, root, "", "logs", "verbs")
	if r.code != 0 || !strings.Contains(r.stdout, "console VMSUP-SHELL-READY") || !strings.Contains(r.stdout, "journal Started") {
		t.Errorf("logs: %+v", r)
	}
	if i, j := strings.Index(r.stdout, "journal Started"), strings.Index(r.stdout, "console VMSUP-SHELL-READY"); i < 0 || j < i {
		t.Errorf("logs: console lines not after the start:\n%s", r.stdout)
	}
}

// cliPlanApply: plan and apply as a user sees them, on TestCLIVerbs's VM: an
// edit planned and applied live, plan then in sync, an impossible edit
// refused with one line naming the field (exit 1), status and ls saying the
// file changed, and the original file applied back.
func cliPlanApply(t *testing.T, root, dir, file, body string) {
	t.Helper()
	edited := strings.Replace(strings.Replace(body, `description = "the verbs test"`, `description = "edited"`, 1),
		`size = "16M"`, "size = \"16M\"\niops = 500", 1)
	write(t, dir, "verbs.toml", edited)
	r := vmsup(t, root, "", "plan", file)
	for _, want := range []string{"verbs: 2 change(s) from " + file, `live       description: "the verbs test" -> "edited" (record)`,
		"live       disk[data].io-limits: unlimited -> iops=500 (block_set_io_throttle)"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("plan lacks %q: %+v", want, r)
		}
	}
	if r = vmsup(t, root, "", "apply", file); r.code != 0 || !strings.HasPrefix(r.stdout, "verbs: applied (2 live)") {
		t.Fatalf("apply: %+v", r)
	}
	if r = vmsup(t, root, "", "plan", file); r.code != 0 || r.stdout != "verbs: in sync with "+file+"\n" {
		t.Fatalf("plan after apply: %+v", r)
	}
	write(t, dir, "verbs.toml", strings.Replace(edited, `size = "16M"`, `size = "8M"`, 1))
	r = vmsup(t, root, "", "apply", file)
	if r.code != 1 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "nothing was changed: disk[data].size: shrinking an image") {
		t.Fatalf("apply of a shrink: %+v", r)
	}
	if r = vmsup(t, root, "", "status", "verbs"); !strings.Contains(r.stdout, "file:     changed (generation ") {
		t.Errorf("status after the file changed: %s", r.stdout)
	}
	if r = vmsup(t, root, "", "ls"); !strings.Contains(r.stdout, "FILE") || !strings.Contains(r.stdout, "changed") {
		t.Errorf("ls after the file changed: %s", r.stdout)
	}
	write(t, dir, "verbs.toml", body)
	if r = vmsup(t, root, "", "apply", file); r.code != 0 || !strings.HasPrefix(r.stdout, "verbs: applied (2 live)") {
		t.Fatalf("apply of the original file: %+v", r)
	}
}
