package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCLIQMPAllowList drives one real QEMU through each class of raw QMP
// command that once reached the host (a listener, an outbound connection,
// a relative path, a program, a host path, an export of the guest's data):
// without --unsafe each is refused by the allow-list in one line (exit 1)
// and recorded in the security log; with --unsafe a harmless instance of it
// is passed to QEMU and recorded as unsafe. The VM has no NIC, so its QEMU
// runs in a network namespace of its own without Internet sockets
// (RestrictAddressFamilies=AF_UNIX): the listener and the connection passed
// with --unsafe fail in QEMU ("Address family not supported"), and would
// stay on its own loopback if they did not; a VM with NICs has the host's
// network, which is why the policy refuses them. The program class is shown
// with a tap whose script QEMU never reaches (it cannot open /dev/net/tun):
// the guestfwd "cmd:" and migrate "exec:" made seccomp kill QEMU,
// so they are only shown refused. Then a flood of commands with a 120 KB
// id leaves every refused and unsafe entry in the security log.
func TestCLIQMPAllowList(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	path := write(t, dir, "qp.toml", strings.Replace(guestTOML("qp", ""), `"20s"`, `"1s"`, 1))
	if r := vmsup(t, root, "", "up", path); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "down", "qp")
	stateDir := filepath.Join(root, "vms", "qp")

	// QEMU runs in its own state directory: a relative path it is given
	// resolves there, not from "/".
	pid := qemuPIDOf(t, root, "qp")
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err != nil || cwd != stateDir {
		t.Errorf("QEMU's working directory: %q (%v), want %s", cwd, err, stateDir)
	}
	r := vmsup(t, root, "", "qmp", "qp", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"rel","filename":"etc/passwd","read-only":true}}`)
	// vmsup opens it there itself, to pass QEMU the descriptor.
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, filepath.Join(stateDir, "etc/passwd")) || !strings.Contains(r.stdout+r.stderr, "no such file") {
		t.Errorf(`blockdev-add "etc/passwd" in the state directory: %+v; want "no such file" for %s`, r, filepath.Join(stateDir, "etc/passwd"))
	}

	var refused, unsafe []string
	for _, c := range qmpTries() {
		r := vmsup(t, root, "", "qmp", "qp", c.refused)
		line := strings.TrimSpace(r.stderr)
		if r.code != 1 || !strings.Contains(line, c.want) || !strings.Contains(line, `vm "qp"`) || !strings.Contains(line, "--unsafe") || strings.Contains(line, "\n") {
			t.Errorf("%s: qmp %s: exit %d, %q; want refused in one line with %q", c.class, c.refused, r.code, r.stderr, c.want)
		}
		t.Logf("%s: %s", c.class, line)
		refused = append(refused, c.refused)
		if c.unsafe == "" {
			continue
		}
		r = vmsup(t, root, "", "qmp", "qp", "--unsafe", c.unsafe)
		t.Logf("%s --unsafe: exit %d: %s", c.class, r.code, strings.TrimSpace(r.stdout+r.stderr))
		if strings.Contains(r.stderr, "refused") {
			t.Errorf("%s --unsafe: %+v", c.class, r)
		}
		unsafe = append(unsafe, c.unsafe)
		if c.undo != "" {
			if r := vmsup(t, root, "", "qmp", "qp", c.undo); r.code != 0 {
				t.Errorf("%s: undo %s: %+v", c.class, c.undo, r)
			}
		}
	}
	if st := cliStatus(t, root, "qp"); st.State != "running" || qemuPIDOf(t, root, "qp") != pid {
		t.Fatalf("the VM after the tries: %s", st.State)
	}
	for _, q := range []string{`{"execute":"query-status"}`, `{"execute":"human-monitor-command","arguments":{"command-line":"info status"}}`} {
		if r := vmsup(t, root, "", "qmp", "qp", q); r.code != 0 || !strings.Contains(r.stdout, "running") {
			t.Errorf("qmp %s: %+v", q, r)
		}
	}
	checkSecurityLog(t, root, refused, unsafe)

	qmpFlood(t, root, refused, unsafe)
}

// qmpTry is one class of command tried: refused without --unsafe (with
// want in the refusal), then, where unsafe is set, a harmless instance
// passed with --unsafe and taken back by undo.
type qmpTry struct {
	class, refused, want, unsafe string
	undo                         string // an allowed command that takes the unsafe one back
}

func qmpTries() []qmpTry {
	up := strings.Repeat("../", 12)
	return []qmpTry{
		{"listener", `{"execute":"nbd-server-start","arguments":{"addr":{"type":"inet","data":{"host":"0.0.0.0","port":"10809"}}}}`, "listens on the network",
			`{"execute":"nbd-server-start","arguments":{"addr":{"type":"inet","data":{"host":"127.0.0.1","port":"0"}}}}`, ""},
		{"listener", `{"execute":"netdev_add","arguments":{"type":"user","id":"u1","hostfwd":[{"str":"tcp:0.0.0.0:2222-:22"}]}}`, "hostfwd", "", ""},
		{"listener", `{"execute":"netdev_add","arguments":{"type":"socket","id":"s1","listen":"0.0.0.0:1234"}}`, `netdev type "socket"`, "", ""},
		{"outbound", `{"execute":"blockdev-add","arguments":{"driver":"nbd","node-name":"n1","server":{"type":"inet","host":"127.0.0.1","port":"1"}}}`, "connects to the network",
			`{"execute":"blockdev-add","arguments":{"driver":"nbd","node-name":"n1","server":{"type":"inet","host":"127.0.0.1","port":"1"}}}`, ""},
		{"outbound", `{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q1","backing":null,"file":{"driver":"http","url":"http://127.0.0.1:1/x"}}}`, "connects to the network", "", ""},
		{"relative path", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"p1","filename":"` + up + `etc/passwd","read-only":true}}`, "relative to QEMU's working directory",
			`{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"p1","filename":"` + up + `etc/passwd","read-only":true}}`, `{"execute":"blockdev-del","arguments":{"node-name":"p1"}}`},
		{"program", `{"execute":"netdev_add","arguments":{"type":"user","id":"u2","guestfwd":[{"str":"tcp:10.0.2.100:1234-cmd:cat /etc/passwd"}]}}`, "guestfwd", "", ""},
		{"program", `{"execute":"migrate","arguments":{"uri":"exec:cat >/dev/null"}}`, "runs a program", "", ""},
		{"program", `{"execute":"netdev_add","arguments":{"type":"tap","id":"t1","ifname":"vmsupqp9","script":"/bin/true","downscript":"no"}}`, "runs a program",
			`{"execute":"netdev_add","arguments":{"type":"tap","id":"t1","ifname":"vmsupqp9","script":"/bin/true","downscript":"no"}}`, ""},
		{"host path", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"h1","filename":"/etc/hostname","read-only":true}}`, "outside the VM's state directory",
			`{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"h1","filename":"/etc/hostname","read-only":true}}`, `{"execute":"blockdev-del","arguments":{"node-name":"h1"}}`},
		{"host path", `{"execute":"blockdev-add","arguments":{"driver":"vvfat","node-name":"v1","dir":"/etc"}}`, "host directory", "", ""},
		{"export", `{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1"}}`, "sends the guest's memory",
			`{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:1"}}`, ""},
		{"export", `{"execute":"block-export-add","arguments":{"type":"nbd","id":"e1","node-name":"x","writable":true}}`, "writable", "", ""},
		{"unknown", `{"execute":"chardev-add","arguments":{"id":"c1","backend":{"type":"socket","data":{"addr":{"type":"unix","data":{"path":"vmsup","abstract":true}},"server":true,"wait":false}}}}`, "not on the allow-list", "", ""},
	}
}

// qmpFlood sends commands with a 120 KB id, passed and refused alike:
// they push nothing out of the security log, and every entry stays small.
func qmpFlood(t *testing.T, root string, refused, unsafe []string) {
	t.Helper()
	pad := strings.Repeat("x", 120<<10)
	for i := range 24 {
		cmd := fmt.Sprintf(`{"execute":"query-status","id":"%d-%s"}`, i, pad)
		if i%2 == 1 {
			cmd = fmt.Sprintf(`{"id":"%d-%s","execute":"no-such-command"}`, i, pad)
		}
		r := vmsup(t, root, "", "qmp", "qp", cmd)
		if (i%2 == 0) != (r.code == 0) {
			t.Fatalf("flood %d: %+v", i, tailResult(r))
		}
		if i%2 == 1 {
			refused = append(refused, cmd)
		}
	}
	checkSecurityLog(t, root, refused, unsafe)
	for _, f := range []string{"qmp.log", "qmp-security.log"} {
		b, _ := os.ReadFile(filepath.Join(root, "records", "qp", f))
		for i, l := range strings.Split(string(b), "\n") {
			if len(l) > 8<<10 {
				t.Errorf("%s line %d: %d bytes", f, i+1, len(l))
			}
		}
	}
}

// securityEntry is the part of a security log entry the test reads.
type securityEntry struct {
	Verdict string `json:"verdict"`
	SHA256  string `json:"sha256"`
	Execute string `json:"execute"`
}

// checkSecurityLog: every refused and unsafe command is in the VM's
// security log, with its verdict, by the hash of the whole command.
func checkSecurityLog(t *testing.T, root string, refused, unsafe []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "records", "qp", "qmp-security.log"))
	if err != nil {
		t.Fatalf("security log: %v", err)
	}
	have := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e securityEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("security log line %q: %v", tail(sc.Text(), 200), err)
		}
		have[e.Verdict+" "+e.SHA256]++
	}
	for _, l := range []struct {
		verdict string
		cmds    []string
	}{{"refused", refused}, {"unsafe", unsafe}} {
		want := map[string]int{}
		for _, c := range l.cmds {
			want[l.verdict+" "+sha256Hex(c)]++
		}
		for k, n := range want {
			if have[k] < n {
				t.Errorf("security log: %d of %d %q entries", have[k], n, k)
			}
		}
	}
}

// qemuPIDOf finds VM name's QEMU of this root among our /proc (the test
// systemd has a PID namespace of its own).
func qemuPIDOf(t *testing.T, root, name string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte("guest="+name+",")) && bytes.Contains(b, []byte(root)) {
			return pid
		}
	}
	t.Fatalf("no QEMU of %s in %s", name, root)
	return 0
}

func tailResult(r result) result {
	r.stdout, r.stderr = tail(r.stdout, 300), tail(r.stderr, 300)
	return r
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
