package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCLIPolish (issue 47, what a day-2 user missed), on one real guest
// whose data disk is an overlay on a stored image, with an I/O limit, a
// NIC whose link is down and a [health] gate:
//   - status, disk ls and nic ls show the I/O limit and the link state;
//   - logs shows what the guest printed in colour without the terminal's
//     control sequences (the console log keeps them);
//   - a restart-class change apply leaves shows once as pending, in plan's
//     words, not "(restart) restart";
//   - apply --restart says what the health gate waits for while it waits;
//   - image prune says what it removed, what it kept and why, and what it
//     freed, and that it removed nothing the second time.
func TestCLIPolish(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	pullImage(t, root, dir, "keep.qcow2", "16M", "keep")
	pullImage(t, root, dir, "loose.qcow2", "32M", "")
	const marker = "VMSUP-SHELL-READY"
	body := guestTOML("polish", "[health]\nconsole = \""+marker+"\"\ntimeout = \"3m\"\n"+
		"[[disk]]\nname = \"data\"\nfile = \""+dir+"/data.qcow2\"\nimage = \"keep\"\niops = 200\n"+
		"[[nic]]\nname = \"net0\"\nlink = \"down\"\n")
	file := write(t, dir, "polish.toml", body)
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "kill", "polish")
	st := cliStatus(t, root, "polish")
	waitCount(t, st.ConsoleLog, marker, 1)
	waitAgent(t, root, "polish")

	r := vmsup(t, root, "", "status", "polish")
	for _, want := range []string{"disk:     data file " + dir + "/data.qcow2 (qcow2) limits iops=200", "nic:      net0 user mac 52:54:00:"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, r.stdout)
		}
	}
	if !regexp.MustCompile(`nic: +net0 user mac \S+ link down`).MatchString(r.stdout) {
		t.Errorf("status does not show net0's link down:\n%s", r.stdout)
	}
	if r := vmsup(t, root, "", "disk", "ls", "polish"); !regexp.MustCompile(`(?m)^DISK .* LIMITS .*\ndata +file +qcow2 +rw +iops=200 `).MatchString(r.stdout) {
		t.Errorf("disk ls does not show data's limit:\n%s", r.stdout)
	}
	if r := vmsup(t, root, "", "nic", "ls", "polish"); !regexp.MustCompile(`(?m)^net0 +user +down `).MatchString(r.stdout) {
		t.Errorf("nic ls does not show net0's link down:\n%s", r.stdout)
	}
	polishLogs(t, root, st.ConsoleLog)
	polishPending(t, root, dir, file, body, marker)
	polishPrune(t, root)
}

// polishLogs: the guest prints coloured words on its console; logs shows
// the words, the console log the bytes as printed.
func polishLogs(t *testing.T, root, consoleLog string) {
	t.Helper()
	colour := `printf '\033[1;32mVMSUP-GREEN\033[0m \033]0;a title\007done\n' > /dev/ttyS0`
	if r := vmsup(t, root, "", "exec", "polish", "--", "/bin/sh", "-c", colour); r.code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	waitCount(t, consoleLog, "VMSUP-GREEN", 1)
	b, _ := os.ReadFile(consoleLog)
	if !strings.Contains(string(b), "\x1b[1;32mVMSUP-GREEN\x1b[0m") {
		t.Errorf("the console log does not keep the guest's bytes: %q", tail(string(b), 300))
	}
	r := vmsup(t, root, "", "logs", "polish")
	if r.code != 0 || !strings.Contains(r.stdout, "VMSUP-GREEN done\n") {
		t.Errorf("logs: %+v, want the guest's words", r)
	}
	if i := strings.IndexAny(r.stdout, "\x1b\x07\r"); i >= 0 {
		t.Errorf("logs shows a control character: %q", r.stdout[max(0, i-80):min(len(r.stdout), i+80)])
	}
}

// polishPending: stop_timeout needs a restart: apply leaves it pending,
// status shows it once in plan's words; apply --restart reports the
// health gate's wait.
func polishPending(t *testing.T, root, dir, file, body, marker string) {
	t.Helper()
	write(t, dir, "polish.toml", strings.Replace(body, `stop_timeout = "20s"`, `stop_timeout = "25s"`, 1))
	if r := vmsup(t, root, "", "apply", file); r.code != 0 {
		t.Fatalf("apply: %+v", r)
	}
	r := vmsup(t, root, "", "status", "polish")
	want := "pending:  1 change(s) an apply left for a restart (vmsup apply --restart):\n          restart    stop_timeout: 20s -> 25s"
	if !strings.Contains(r.stdout, want) || strings.Contains(r.stdout, "(restart) restart") {
		t.Errorf("status after an apply left a restart:\n%s\nwant %q", r.stdout, want)
	}
	r = vmsup(t, root, "", "apply", "--restart", file)
	if r.code != 0 || !strings.Contains(r.stdout, "restarted") ||
		!regexp.MustCompile(`polish: health gate: waiting for .*the console to print "`+marker+`" \(1s of 3m0s\)…\n`).MatchString(r.stderr) {
		t.Fatalf("apply --restart: %+v, want the gate's wait on stderr", r)
	}
	t.Logf("apply --restart:\n%s%s", r.stderr, r.stdout)
	if r := vmsup(t, root, "", "status", "polish"); strings.Contains(r.stdout, "pending:") {
		t.Errorf("status after the restart still shows a pending change:\n%s", r.stdout)
	}
}

// polishPrune: prune removes the image no alias names and no VM uses and
// says so; the one the VM's disk stands on is kept, saying why.
func polishPrune(t *testing.T, root string) {
	t.Helper()
	r := vmsup(t, root, "", "image", "prune")
	removed := regexp.MustCompile(`(?m)^removed sha256:[0-9a-f]{64} \(http://127\.0\.0\.1:\d+/loose\.qcow2, [0-9.]+ [KM]iB\)$`)
	kept := regexp.MustCompile(`(?m)^kept sha256:[0-9a-f]{64} \(alias keep; used by .*polish.*\)$`)
	if r.code != 0 || !removed.MatchString(r.stdout) || !kept.MatchString(r.stdout) || !regexp.MustCompile(`(?m)^freed [0-9.]+ [KM]iB; 1 image\(s\) kept$`).MatchString(r.stdout) {
		t.Fatalf("image prune: %+v", r)
	}
	t.Logf("image prune:\n%s", r.stdout)
	r = vmsup(t, root, "", "image", "prune")
	if r.code != 0 || !kept.MatchString(r.stdout) || !strings.Contains(r.stdout, "nothing to remove: 1 image(s) kept (named by an alias or used by a VM)\n") {
		t.Fatalf("a second image prune: %+v", r)
	}
}

// pullImage makes a blank qcow2 of size and pulls it into root's image
// store over loopback HTTP with the CLI, as alias name ("" for none).
func pullImage(t *testing.T, root, dir, file, size, name string) {
	t.Helper()
	src := filepath.Join(dir, "src-"+file)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", src, size).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(b) }))
	defer srv.Close()
	args := []string{"image", "pull", srv.URL + "/" + file, "--sha256", hex.EncodeToString(sum[:])}
	if name != "" {
		args = append(args, "--name", name)
	}
	if r := vmsup(t, root, "", args...); r.code != 0 {
		t.Fatalf("image pull: %+v", r)
	}
}
