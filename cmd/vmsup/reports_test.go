package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// TestCLIUserReports: what users met (issue 29), one subtest each, on one
// guest with a user-mode NIC whose link is down and a sparse data disk
// holding 450 KiB.
func TestCLIUserReports(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	data := filepath.Join(dir, "data.qcow2")
	for _, c := range [][]string{{"qemu-img", "create", "-q", "-f", "qcow2", data, "64M"},
		{"qemu-io", "-f", "qcow2", "-c", "write -P 0xab 0 450k", data}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	extra := fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\n\n[[nic]]\nname = \"net0\"\nlink = \"down\"\n", data)
	file := write(t, dir, "web.toml", guestTOML("web", extra))
	start := time.Now()
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "kill", "web")
	log := cliStatus(t, root, "web").ConsoleLog
	waitFor(t, log, testenv.ShellMarker, 2*time.Minute)

	t.Run("did you mean", func(t *testing.T) { didYouMean(t, root) })
	t.Run("link state", func(t *testing.T) { linkState(t, root, file) })
	t.Run("console times", func(t *testing.T) { consoleTimes(t, root, start) })
	t.Run("backup copied", func(t *testing.T) { backupCopied(t, root, dir) })
	t.Run("top", func(t *testing.T) { topKeys(t, root) })
	t.Run("paused agent", func(t *testing.T) { pausedAgentCLI(t, root) })
	t.Run("interrupted down", func(t *testing.T) { interruptedDown(t, root) })
}

// didYouMean: every command that takes a VM name suggests a known VM
// close to a mistyped one, and only a close one.
func didYouMean(t *testing.T, root string) {
	for _, args := range [][]string{{"status", "wbe"}, {"down", "wbe"}, {"logs", "wbe"}, {"events", "wbe"},
		{"pause", "wbe"}, {"nic", "ls", "wbe"}, {"exec", "wbe", "--", "true"}, {"stats", "weg"}, {"rm", "we"}} {
		r := vmsup(t, root, "", args...)
		name := args[len(args)-1]
		if args[0] == "exec" {
			name = args[1]
		}
		want := fmt.Sprintf("vmsup: vm %q: no such VM (did you mean \"web\"?)\n", name)
		if r.code != exitNotFound || r.stderr != want {
			t.Errorf("%v: exit %d, stderr %q\n want exit %d, %q", args, r.code, r.stderr, exitNotFound, want)
		}
	}
	if r := vmsup(t, root, "", "status", "database"); r.stderr != "vmsup: vm \"database\": no such VM\n" {
		t.Errorf("status of a name close to none: %q", r.stderr)
	}
}

// linkState: nic ls and status, text and JSON, say whether the NIC's link
// is up, and follow an apply that sets it.
func linkState(t *testing.T, root, file string) {
	check := func(want string) {
		t.Helper()
		r := vmsup(t, root, "", "nic", "ls", "web")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], "LINK") || !strings.Contains(" "+lines[1]+" ", " "+want+" ") {
			t.Errorf("nic ls, want link %s:\n%s", want, r.stdout)
		}
		r = vmsup(t, root, "", "--json", "nic", "ls", "web")
		var nics []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &nics); err != nil || len(nics) != 1 || nics[0]["link"] != want {
			t.Errorf("nic ls --json, want link %q: %v\n%s", want, err, r.stdout)
		}
		r = vmsup(t, root, "", "status", "web")
		if !strings.Contains(r.stdout, "nic:      net0 user mac ") || !strings.Contains(r.stdout, " link "+want) {
			t.Errorf("status, want link %s:\n%s", want, r.stdout)
		}
		var st struct {
			NICs []map[string]any `json:"nics"`
		}
		r = vmsup(t, root, "", "--json", "status", "web")
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.NICs) != 1 || st.NICs[0]["link"] != want {
			t.Errorf("status --json, want link %q: %v\n%s", want, err, r.stdout)
		}
	}
	check("down")
	b, _ := os.ReadFile(file)
	write(t, filepath.Dir(file), filepath.Base(file), strings.Replace(string(b), `link = "down"`, `link = "up"`, 1))
	if r := vmsup(t, root, "", "apply", file); r.code != 0 {
		t.Fatalf("apply link up: %+v", r)
	}
	check("up")
}

// consoleTimes: logs without -f gives every console line the time it was
// written, as -f does, in the same format.
func consoleTimes(t *testing.T, root string, start time.Time) {
	r := vmsup(t, root, "", "logs", "web")
	n := 0
	for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
		if len(l) < 32 || l[24:31] != "console" {
			continue
		}
		n++
		ts, err := time.ParseInLocation("2006-01-02T15:04:05.000", l[:23], time.Local)
		if err != nil || ts.Before(start.Add(-time.Second)) || ts.After(time.Now().Add(time.Second)) {
			t.Errorf("console line without its time (want one since %s): %q", start.Format(time.TimeOnly), l)
			return
		}
	}
	if n == 0 {
		t.Fatalf("logs: no console line:\n%s", r.stdout)
	}
	r = vmsup(t, root, "", "--json", "logs", "web")
	if !strings.Contains(r.stdout, `"source":"console"`) || strings.Contains(r.stdout, `"time":null,"source":"console"`) {
		t.Errorf("logs --json: console lines without time:\n%s", tail(r.stdout, 2000))
	}
}

// backupCopied: a backup of a 64 MiB disk holding 450 KiB says it copied
// about 450 KiB (what the point's file holds), and the disk's virtual size
// apart.
func backupCopied(t *testing.T, root, dir string) {
	r := vmsup(t, root, "", "backup", "web", "--to", filepath.Join(dir, "b1"))
	if r.code != 0 || !strings.Contains(r.stdout, "512.0 KiB copied (virtual size 64.0 MiB)") {
		t.Errorf("backup, want 512.0 KiB (450 KiB in 64 KiB clusters) copied of 64.0 MiB: %+v", r)
	}
	r = vmsup(t, root, "", "--json", "backup", "web", "--to", filepath.Join(dir, "b2"))
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var done struct {
		Result struct {
			Disks []struct {
				Size   int64 `json:"size"`
				Copied int64 `json:"copied"`
			} `json:"disks"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &done); err != nil || len(done.Result.Disks) != 1 {
		t.Fatalf("backup --json: %v\n%s", err, r.stdout)
	}
	if d := done.Result.Disks[0]; d.Size != 64<<20 || d.Copied < 450<<10 || d.Copied > 1<<20 {
		t.Errorf("backup --json: size %d copied %d, want %d and about 450 KiB", d.Size, d.Copied, 64<<20)
	}
}

// topKeys: top on a terminal shows "-" for the traffic of a user-mode NIC
// (vmsup cannot measure it), quits on q, and on Ctrl-C, and leaves the
// terminal as it was.
func topKeys(t *testing.T, root string) {
	for _, key := range []string{"q", "\x03"} {
		frames := topUntil(t, root, key)
		if key != "q" {
			continue
		}
		for _, col := range []string{"NET RX/s", "NET TX/s"} {
			if cell := topCell(frames[len(frames)-2], "web", col); cell != "-" {
				t.Errorf("top: %s of a VM with only a user-mode NIC is %q, want \"-\":\n%s", col, cell, frames[len(frames)-2])
			}
		}
	}
}

// topUntil runs top on a new terminal until it printed 3 frames, types
// key, checks that top ends at once with the terminal as it was, and
// returns the frames.
func topUntil(t *testing.T, root, key string) []string {
	master, slave := openPTY(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := vmsupCmd(ctx, root, "top", "--every", "300ms", "web")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	frames := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Split(strings.ReplaceAll(out.String(), "\r", ""), "\x1b[2J")
	}
	for deadline := time.Now().Add(30 * time.Second); len(frames()) < 4 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	fs := frames()
	if len(fs) < 4 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("top printed fewer than 3 frames in 30s:\n%q", fs)
	}
	master.Write([]byte(key))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("top after %q: %v", key, err)
		}
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Errorf("top did not quit on %q within 5s", key)
	}
	tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	if err != nil || tio.Lflag&(unix.ICANON|unix.ECHO) != unix.ICANON|unix.ECHO {
		t.Errorf("top ended by %q left the terminal without ICANON and ECHO: %+v %v", key, tio, err)
	}
	return fs
}

// topCell is the cell of row name under column col of a top frame: the
// table is right-aligned, so a cell ends where its header does.
func topCell(frame, name, col string) string {
	var header, row string
	for _, l := range strings.Split(frame, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "NAME":
			header = l
		case len(f) > 0 && f[0] == name:
			row = l
		}
	}
	end := strings.Index(header, col) + len(col)
	if end < len(col) || end > len(row) {
		return fmt.Sprintf("(no cell: header %q, row %q)", header, row)
	}
	cells := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(row[:end]), -1)
	return cells[len(cells)-1]
}

// openPTY opens a pseudo-terminal pair, closed when the test ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// pausedAgentCLI: exec and ping on a paused VM say so at once.
func pausedAgentCLI(t *testing.T, root string) {
	waitAgent(t, root, "web")
	if r := vmsup(t, root, "", "pause", "web"); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}
	defer vmsup(t, root, "", "resume", "web")
	want := "vmsup: vm \"web\": paused: the guest agent cannot answer while the VM is paused (vmsup resume web)\n"
	for _, args := range [][]string{{"exec", "web", "--timeout", "10s", "--", "true"}, {"ping", "web"}} {
		t0 := time.Now()
		r := vmsup(t, root, "", args...)
		if r.code == 0 || r.stderr != want || time.Since(t0) > 3*time.Second {
			t.Errorf("%v on a paused VM: %+v after %s\n want at once: %q", args, r, time.Since(t0).Round(time.Millisecond), want)
		}
	}
}

// interruptedDown: Ctrl-C while down waits for a guest that ignores the
// power button says what it left, and exits 130; the VM runs on.
func interruptedDown(t *testing.T, root string) {
	st := cliStatus(t, root, "web")
	sh, err := testenv.DialConsole(context.Background(), filepath.Join(filepath.Dir(st.ConsoleLog), "console.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, code, err := sh.Run(ctx, "kill $(pidof acpid)"); err != nil || code != 0 {
		t.Fatalf("kill acpid: %d %v %s", code, err, out)
	}
	sh.Close()
	cmd := vmsupCmd(ctx, root, "down", "web")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), "waiting for the guest to power off") && len(lines) == 1 {
			cmd.Process.Signal(os.Interrupt)
		}
	}
	err = cmd.Wait()
	want := `vmsup: vm "web": interrupted: it is still running (its guest was asked to power off; nothing was killed)`
	if cmd.ProcessState.ExitCode() != exitInterrupted || len(lines) != 2 || lines[1] != want {
		t.Errorf("down interrupted: %v, stderr:\n%s\nwant exit %d and %s", err, strings.Join(lines, "\n"), exitInterrupted, want)
	}
	if st := cliStatus(t, root, "web"); st.State != "running" {
		t.Errorf("after an interrupted down: %+v, want running", st)
	}
}
