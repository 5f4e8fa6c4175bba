package supervisor_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// TestStateDirPlanted: QEMU's user owns the VM's state directory, so a
// compromised QEMU can put anything there. vmsup, running as root, must not
// be led by it: a lock file swapped for a symlink is not followed (the file
// it points to stays intact), records planted there are not read (the unit to
// stop comes from Root/records, which only root can reach), and down still
// ends the VM.
func TestStateDirPlanted(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	f := guestFile(t, t.TempDir(), "planted", "stop_timeout = \"2s\"")
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(ctx, "planted")
	st, err := sup.Status(ctx, "planted")
	if err != nil {
		t.Fatal(err)
	}
	records := filepath.Join(root, "records")
	if fi, err := os.Stat(records); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("records directory: %v %v", fi.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(st.StateDir, "state.json")); !os.IsNotExist(err) {
		t.Fatalf("state.json in the directory QEMU owns: %v", err)
	}

	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(st.StateDir, "qmp.lock")
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, lock); err != nil {
		t.Fatal(err)
	}
	// What a forged record would say if vmsup still read one here.
	os.WriteFile(filepath.Join(st.StateDir, "state.json"), []byte(`{"name":"planted","unit":"dbus.service"}`), 0o600)

	if _, err := sup.Status(ctx, "planted"); err != nil {
		t.Fatal(err)
	}
	if err := sup.Pause(ctx, "planted"); err == nil {
		t.Fatal("pause went through a symlinked lock file")
	}
	// Sockets swapped for symlinks to a decoy (another VM's monitor, say):
	// vmsup refuses them and never connects to the decoy.
	os.Remove(lock)
	if err := os.WriteFile(lock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	decoy := filepath.Join(t.TempDir(), "decoy.sock")
	ln, err := net.Listen("unix", decoy)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	for _, sock := range []string{"qmp.sock", "console.sock"} {
		p := filepath.Join(st.StateDir, sock)
		os.Remove(p)
		if err := os.Symlink(decoy, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := sup.Pause(ctx, "planted"); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("pause through a symlinked monitor: %v", err)
	}
	if c, err := sup.DialConsole(ctx, "planted"); err == nil {
		c.Close()
		t.Fatal("console through a symlink")
	}
	select {
	case <-accepted:
		t.Fatal("vmsup connected to the decoy socket")
	case <-time.After(100 * time.Millisecond):
	}

	res, err := sup.Down(ctx, "planted")
	if err != nil {
		t.Fatalf("down with a planted lock: %v", err)
	}
	t.Logf("down: %+v", res)
	if b, err := os.ReadFile(victim); err != nil || string(b) != "precious\n" {
		t.Fatalf("the symlink's target was changed: %q %v", b, err)
	}
	if st, err := sup.Status(ctx, "planted"); err != nil || st.State != supervisor.StateShutOff || st.Unit != "vmsup-planted.service" {
		t.Fatalf("after down: %+v %v", st, err)
	}
	if out, _ := env.Systemd.Systemctl(ctx, "is-active", "dbus.service"); string(out) != "active\n" {
		t.Fatalf("dbus.service: %q", out)
	}
}
