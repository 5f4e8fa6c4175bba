package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// TestCLIHostileInput: inputs that once hung vmsup, exhausted the host's
// memory or crashed systemd are refused by validate and by up within a
// second, in one line, and nothing is started or left behind.
func TestCLIHostileInput(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// /dev/zero's double in a place the tests allow (/dev itself is not
	// one for a seed's or a secret's file).
	zero := filepath.Join(dir, "zero")
	if err := syscall.Mknod(zero, syscall.S_IFCHR|0o600, 1<<8|5); err != nil {
		t.Fatal(err)
	}
	bigCmdline := strings.Repeat("x", 5<<20)
	cases := []struct {
		name, body, want string
	}{
		{"cmdline-5M", strings.Replace(guestTOML("h1", ""), `cmdline = "console=ttyS0 no_timer_check"`, `cmdline = "`+bigCmdline+`"`, 1),
			"5.0 MiB, more than the 1.0 MiB vmsup reads"},
		{"cmdline-200K", strings.Replace(guestTOML("h2", ""), `cmdline = "console=ttyS0 no_timer_check"`, `cmdline = "`+bigCmdline[:200<<10]+`"`, 1),
			"boot.cmdline: 204800 bytes, more than the limit of 4096"},
		{"user-data-dev-zero", guestTOML("h3", "") + "\n[[disk]]\nname = \"seed\"\ntype = \"seed\"\nuser_data_file = \"" + zero + "\"\n",
			zero + " is a character device, not a regular file"},
		{"secret-dev-zero", guestTOML("h4", "") + "\n[[disk]]\nname = \"lun\"\ntype = \"iscsi\"\nportal = \"127.0.0.1:3260\"\ntarget = \"iqn.2026-01.test:t\"\nuser = \"u\"\nsecret_file = \"" + zero + "\"\n",
			"secret_file: disk \"lun\": " + zero + " is a character device, not a regular file"},
		{"disk-fifo", guestTOML("h5", "") + "\n[[disk]]\nname = \"d\"\nfile = \"" + fifo + "\"\nformat = \"raw\"\n",
			"is a FIFO, not an image file"},
		{"seed-fifo", guestTOML("h6", "") + "\n[[disk]]\nname = \"seed\"\ntype = \"seed\"\nuser_data_file = \"" + fifo + "\"\n",
			"is a FIFO, not a regular file"},
		{"toml-25M", guestTOML("h7", "") + strings.Repeat("# padding padding padding padding\n", 25<<20/34),
			"5.0 MiB, more than the 1.0 MiB vmsup reads"},
		{"toml-16k-keys", guestTOML("h8", "") + "[x]\n" + manyKeys(16<<10), "keys, more than the 4096 vmsup reads"},
		{"stop-timeout-huge", strings.Replace(guestTOML("h9", ""), `stop_timeout = "20s"`, `stop_timeout = "2562047h"`, 1),
			"stop_timeout: 2562047h0m0s is out of range"},
		{"stop-timeout-zero", strings.Replace(guestTOML("h10", ""), `stop_timeout = "20s"`, `stop_timeout = "0s"`, 1),
			"stop_timeout: 0s: must be more than 0s"},
		{"user-data-outside", guestTOML("h11", "") + "\n[[disk]]\nname = \"seed\"\ntype = \"seed\"\nuser_data_file = \"/dev/zero\"\n",
			"disk[0].user_data_file: /dev/zero is outside the places VM files may name"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := write(t, dir, c.name+".toml", c.body)
			for _, cmd := range []string{"validate", "up"} {
				t0 := time.Now()
				r := vmsup(t, root, "", cmd, path)
				took := time.Since(t0)
				if r.code == 0 || !strings.Contains(r.stderr, c.want) {
					t.Fatalf("%s: exit %d, stderr %q; want %q", cmd, r.code, tail(r.stderr, 300), c.want)
				}
				if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n > 0 {
					t.Fatalf("%s: %d lines: %q", cmd, n+1, tail(r.stderr, 300))
				}
				if took > time.Second {
					t.Fatalf("%s took %s", cmd, took)
				}
				t.Logf("%s: %s in %s", cmd, strings.TrimSpace(r.stderr)[:min(len(strings.TrimSpace(r.stderr)), 160)], took.Round(time.Millisecond))
			}
			name := fmt.Sprintf("h%d", i+1)
			if u := vmsupUnits(t); strings.Contains(u, "vmsup-"+name+".service") {
				t.Fatalf("a unit was started: %s", u)
			}
			if _, err := os.Stat(filepath.Join(root, "vms", name)); err == nil {
				t.Fatal("a state directory was left")
			}
		})
	}

	t.Run("running-vm", func(t *testing.T) {
		path := write(t, dir, "att.toml", strings.Replace(guestTOML("att", ""), `"20s"`, `"1s"`, 1)) // down need not wait for the guest
		if r := vmsup(t, root, "", "up", path); r.code != 0 {
			t.Fatalf("up: %s", r.stderr)
		}
		defer vmsup(t, root, "", "down", "att")
		img := filepath.Join(root, "images", "fifo.raw")
		if err := syscall.Mkfifo(img, 0o600); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		r := vmsup(t, root, "", "disk", "attach", "att", "--file", img)
		took := time.Since(t0)
		if r.code == 0 || !strings.Contains(r.stderr, "is a FIFO, not an image file") || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 || took > time.Second {
			t.Fatalf("disk attach of a FIFO: exit %d in %s: %q", r.code, took, r.stderr)
		}
		t.Logf("disk attach: %s in %s", strings.TrimSpace(r.stderr), took.Round(time.Millisecond))
		if st := vmsup(t, root, "", "status", "att", "--json"); !strings.Contains(st.stdout, `"state": "running"`) || strings.Contains(st.stdout, `"hotplugged": true`) {
			t.Fatalf("the VM after the refused attach: %s", st.stdout)
		}

		// The raw QMP policy: what leaves the confinement or ends the VM is
		// refused (one line, exit 1), the VM runs on, and every command is
		// logged with its verdict (TestCLIQMPAllowList has the classes).
		for _, c := range []struct{ cmd, want string }{
			{`{"execute":"human-monitor-command","arguments":{"command-line":"gdbserver tcp::4321"}}`, `only "info ..." passes`},
			{`{"execute":"human-monitor-command","arguments":{"command-line":"hostfwd_add tcp::2222-:22"}}`, `only "info ..." passes`},
			{`{"execute":"migrate","arguments":{"uri":"exec:cat >/tmp/vmsup-mig"}}`, "runs a program"},
			{`{"execute":"chardev-add","arguments":{"id":"c0","backend":{"type":"file","data":{"out":"/tmp/vmsup-chardev"}}}}`, "not on the allow-list"},
			{`{"execute":"chardev-add","arguments":{"id":"c1","backend":{"type":"socket","data":{"addr":{"type":"inet","data":{"host":"127.0.0.1","port":"4322"}},"server":true,"wait":false}}}}`, "not on the allow-list"},
			{`{"execute":"object-add","arguments":{"qom-type":"memory-backend-file","id":"m0","mem-path":"/tmp/vmsup-mem","size":1048576}}`, "a host path outside"},
			{`{"execute":"quit"}`, "use vmsup down"},
		} {
			r := vmsup(t, root, "", "qmp", "att", c.cmd)
			if r.code != 1 || !strings.Contains(r.stderr, c.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
				t.Errorf("qmp %s: exit %d, %q; want refused with %q", c.cmd, r.code, r.stderr, c.want)
			}
		}
		if r := vmsup(t, root, "", "qmp", "att", `{"execute":"human-monitor-command","arguments":{"command-line":"info status"}}`); r.code != 0 || !strings.Contains(r.stdout, "running") {
			t.Errorf("qmp info status: %+v", r)
		}
		if r := vmsup(t, root, "", "qmp", "att", "--unsafe", `{"execute":"human-monitor-command","arguments":{"command-line":"help info"}}`); r.code != 0 {
			t.Errorf("qmp --unsafe: %+v", r)
		}
		for _, f := range []string{"/tmp/vmsup-mig", "/tmp/vmsup-chardev", "/tmp/vmsup-mem"} {
			if _, err := os.Stat(f); err == nil {
				t.Errorf("%s was made", f)
			}
		}
		if st := vmsup(t, root, "", "status", "att", "--json"); !strings.Contains(st.stdout, `"state": "running"`) {
			t.Fatalf("the VM after the refused commands: %s", st.stdout)
		}
		log, err := os.ReadFile(filepath.Join(root, "records", "att", "qmp.log"))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(log), `"verdict":"refused"`); n != 7 || !strings.Contains(string(log), `"verdict":"unsafe"`) ||
			!strings.Contains(string(log), `gdbserver tcp::4321`) {
			t.Errorf("qmp.log (%d refused):\n%s", n, log)
		}
	})

	t.Run("sigterm-while-waiting", func(t *testing.T) {
		// up --wait of a VM whose lock another vmsup holds: SIGTERM ends it
		// within a second, and it leaves nothing.
		lk, ok, err := vmstore.LockFile(context.Background(), filepath.Join(root, "vms", ".busy.lock"), false)
		if err != nil || !ok {
			os.MkdirAll(filepath.Join(root, "vms"), 0o700)
			lk, ok, err = vmstore.LockFile(context.Background(), filepath.Join(root, "vms", ".busy.lock"), false)
			if err != nil || !ok {
				t.Fatalf("lock: %v %v", ok, err)
			}
		}
		defer lk.Unlock()
		path := write(t, dir, "busy.toml", guestTOML("busy", ""))
		cmd := exec.Command(vmsupBin, "up", "--wait", path)
		cmd.Env = append(os.Environ(), "VMSUP_ROOT="+root, "VMSUP_SYSTEMD_BUS="+env.Systemd.BusAddress)
		cmd.Env = append(cmd.Env, env.CLIEnv()...)
		var out strings.Builder
		cmd.Stderr = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		t0 := time.Now()
		cmd.Process.Signal(syscall.SIGTERM)
		err = cmd.Wait()
		took := time.Since(t0)
		if err == nil || took > time.Second || !strings.Contains(out.String(), "interrupted while waiting for the lock") {
			t.Fatalf("after SIGTERM: %v in %s; stderr %q", err, took, out.String())
		}
		t.Logf("ended %s after SIGTERM: %v, %q", took.Round(time.Millisecond), err, strings.TrimSpace(out.String()))
		if strings.Contains(vmsupUnits(t), "vmsup-busy") {
			t.Fatal("a unit was started")
		}
	})
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "k%d = 1\n", i)
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
