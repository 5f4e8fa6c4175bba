package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCLIMigrate: "vmsup migrate --local --json" prints progress events and
// a result, status follows the new unit, "--cancel" stops a throttled
// migration in another process (which then fails, the VM still running),
// and bad invocations give one line and exit 2.
func TestCLIMigrate(t *testing.T) {
	root := t.TempDir()
	// A user NIC with a host forward: the new QEMU takes its port over
	// once the old one quit (it failed to start before: port in use).
	port := freePort(t)
	spec := write(t, t.TempDir(), "cm.toml", guestTOML("cm", fmt.Sprintf("[[nic]]\nname = \"net0\"\nforwards = [\"tcp:127.0.0.1:%d-:22\"]\n", port)))
	if r := vmsup(t, root, "", "up", spec); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "down", "cm")

	if r := vmsup(t, root, "", "migrate", "cm"); r.code != 2 || !strings.Contains(r.stderr, "give exactly one of --to HOST and --local") {
		t.Fatalf("migrate without a destination: %+v", r)
	}
	if r := vmsup(t, root, "", "migrate", "--cancel", "cm"); r.code != 1 || !strings.Contains(r.stderr, `vm "cm": no migration in progress`) {
		t.Fatalf("cancel with nothing to cancel: %+v", r)
	}

	r := vmsup(t, root, "", "migrate", "cm", "--local", "--json")
	if r.code != 0 {
		t.Fatalf("migrate --local --json: %+v", r)
	}
	var last struct {
		Event  string
		Result struct {
			Unit             string
			TransferredBytes int64 `json:"transferred_bytes"`
		}
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	for _, l := range lines {
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("not a JSON line: %q (%v)", l, err)
		}
	}
	if last.Event != "done" || last.Result.Unit != "vmsup-cm@migrated.service" || last.Result.TransferredBytes == 0 {
		t.Fatalf("last event: %+v\n%s", last, r.stdout)
	}
	st := vmsup(t, root, "", "status", "cm", "--json")
	if !strings.Contains(st.stdout, `"unit": "vmsup-cm@migrated.service"`) || !strings.Contains(st.stdout, `"state": "running"`) {
		t.Fatalf("status after migrate: %s", st.stdout)
	}
	r = vmsup(t, root, "", "qmp", "cm", `{"execute":"human-monitor-command","arguments":{"command-line":"info usernet"}}`)
	if r.code != 0 || !strings.Contains(r.stdout, "HOST_FORWARD") || !strings.Contains(r.stdout, fmt.Sprint(port)) {
		t.Fatalf("the new QEMU lacks the forward: %+v", r)
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second); err != nil {
		t.Fatalf("forwarded port after migrate: %v", err)
	} else {
		c.Close()
	}

	// A throttled migration (its RAM copied: --no-cpr), cancelled from another process.
	cmd := exec.Command(vmsupBin, "migrate", "cm", "--local", "--no-cpr", "--bandwidth", "1M")
	cmd.Env = append(os.Environ(), "VMSUP_ROOT="+root, "VMSUP_SYSTEMD_BUS="+env.Systemd.BusAddress, "VMSUP_JOURNAL_DIR="+env.Systemd.JournalDir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var c result
	for i := 0; i < 100; i++ {
		time.Sleep(200 * time.Millisecond)
		if c = vmsup(t, root, "", "migrate", "--cancel", "cm"); c.code == 0 {
			break
		}
	}
	if c.code != 0 {
		t.Fatalf("cancel: %+v", c)
	}
	err := cmd.Wait()
	if err == nil || !strings.Contains(errb.String(), "migration cancelled (the guest runs on: source)") {
		t.Fatalf("cancelled migrate: %v\nstdout %s\nstderr %s", err, out.String(), errb.String())
	}
	if strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
		t.Fatalf("want one line on stderr, got %q", errb.String())
	}
	st = vmsup(t, root, "", "status", "cm", "--json")
	if !strings.Contains(st.stdout, `"unit": "vmsup-cm@migrated.service"`) || !strings.Contains(st.stdout, `"state": "running"`) {
		t.Fatalf("status after cancel: %s", st.stdout)
	}
	if u := vmsupUnits(t); strings.Count(u, "vmsup-cm") != 1 {
		t.Fatalf("units after cancel: %s", u)
	}

	// SIGHUP (a dropped ssh session) and SIGTERM mid-stream cancel as
	// cleanly as Ctrl-C: the command ends, the guest runs on the source,
	// and nothing of the migration is left (unit, journal, guardian).
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM} {
		cmd := exec.Command(vmsupBin, "migrate", "cm", "--local", "--no-cpr", "--bandwidth", "1M", "--json")
		cmd.Env = append(os.Environ(), "VMSUP_ROOT="+root, "VMSUP_SYSTEMD_BUS="+env.Systemd.BusAddress, "VMSUP_JOURNAL_DIR="+env.Systemd.JournalDir)
		var errb bytes.Buffer
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = pw, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(pr)
		for sc.Scan() && !strings.Contains(sc.Text(), `"active"`) {
		}
		go io.Copy(io.Discard, pr)
		t0 := time.Now()
		cmd.Process.Signal(sig)
		err := cmd.Wait()
		pw.Close()
		took := time.Since(t0)
		if err == nil || !strings.Contains(errb.String(), "the guest runs on: source") {
			t.Fatalf("%v mid-stream: %v after %s: %q", sig, err, took, errb.String())
		}
		t.Logf("%v mid-stream: ended in %s: %s", sig, took.Round(time.Millisecond), strings.TrimSpace(errb.String()))
		st := vmsup(t, root, "", "status", "cm", "--json")
		if !strings.Contains(st.stdout, `"state": "running"`) || strings.Contains(st.stdout, `"recovery"`) {
			t.Fatalf("status after %v: %s", sig, st.stdout)
		}
		if u := vmsupUnits(t); strings.Count(u, "vmsup-cm") != 1 {
			t.Fatalf("units after %v: %s", sig, u)
		}
		if _, err := os.Stat(filepath.Join(root, "records", "cm", "op.json")); err == nil {
			t.Fatalf("a journal is left after %v", sig)
		}
	}
	checkPlainMigrate(t, root)
}

// checkPlainMigrate: the plain result of migrate --local is cpr-transfer
// where this QEMU has it (QEMU 10), else the figures and one line saying
// why the RAM was copied.
func checkPlainMigrate(t *testing.T, root string) {
	t.Helper()
	r := vmsup(t, root, "", "migrate", "cm", "--local")
	inPlace := strings.Contains(r.stdout, "cm: migrated to local in ") && strings.Contains(r.stdout, "(cpr-transfer: the new QEMU took the guest's RAM in place, guest paused ")
	copied := strings.Contains(r.stdout, "transferred)\ncm: RAM copied, not taken over in place (cpr-transfer): QEMU ")
	if r.code != 0 || inPlace == copied {
		t.Fatalf("migrate --local: %+v", r)
	}
	t.Logf("migrate --local: %s", strings.TrimSpace(r.stdout))
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
