package networktest

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/supervisor"
)

// TestReloadMidLife: a VM (a bridge NIC, credentials: a tap and secret
// copies for its stop-post hook to remove) survives `systemctl
// daemon-reload`, which makes systemd 252 re-read its transient unit from
// the file it wrote at start: every property of the unit is the same
// after the reload as before (none written in a form that systemd cannot
// read back: ExecStopPostEx= was, "Unknown key ... ignoring", and the hook
// was lost), and when QEMU is then killed, the stop-post hook still
// removes the tap and the secret copies, and the VM is recorded crashed.
func TestReloadMidLife(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	sup := newSup(t)
	f := guestFile(t, "reloadvm", "", `stop_timeout = "5s"
[credentials]
token = "reload-secret"
[[nic]]
name = "lan"
type = "bridge"
bridge = "`+linuxBridge+`"
`)
	tap := f.VM.NICs[0].Tap
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(context.Background(), "reloadvm")
	st, err := sup.Status(ctx, "reloadvm")
	if err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("status %+v %v", st, err)
	}
	secrets := filepath.Join(st.StateDir, "secrets")
	if _, err := os.Stat(secrets); err != nil || !netsetup.LinkExists(tap) {
		t.Fatalf("before the reload: secret copies %v, tap %s exists %v", err, tap, netsetup.LinkExists(tap))
	}
	unit := "vmsup-reloadvm.service"
	before, err := env.Systemd.UnitProperties(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := env.Systemd.Systemctl(ctx, "daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v %s", err, out)
	}
	after, err := env.Systemd.UnitProperties(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(before, after); d != "" {
		var changed []string
		for k, v := range before {
			if after[k] != v {
				changed = append(changed, k)
			}
		}
		sort.Strings(changed)
		t.Errorf("daemon-reload changed %s (-before +after):\n%s", strings.Join(changed, " "), d)
	}
	journal, _ := env.Systemd.Journal(ctx, unit)
	if strings.Contains(journal, "Unknown key") {
		t.Errorf("systemd did not understand the unit's transient file:\n%s", journal)
	}
	if st, err := sup.Status(ctx, "reloadvm"); err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("after the reload: %+v %v", st, err)
	}

	pids, err := env.Systemd.HostPIDs(unit)
	if err != nil || len(pids) != 1 {
		t.Fatalf("QEMU pids %v %v", pids, err)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, _ = sup.Status(ctx, "reloadvm")
		_, serr := os.Stat(secrets)
		if st.State == supervisor.StateCrashed && !netsetup.LinkExists(tap) && os.IsNotExist(serr) {
			break
		}
	}
	journal, _ = env.Systemd.Journal(ctx, unit)
	if st.State != supervisor.StateCrashed {
		t.Errorf("after kill -9: state %s, want crashed", st.State)
	}
	if netsetup.LinkExists(tap) {
		t.Errorf("after kill -9: tap %s left", tap)
	}
	if _, err := os.Stat(secrets); !os.IsNotExist(err) {
		t.Errorf("after kill -9: secret copies left in %s (%v)", secrets, err)
	}
	if !strings.Contains(journal, "network removed, secret copies removed") {
		t.Errorf("the stop-post hook did not run; journal:\n%s", journal)
	}
}
