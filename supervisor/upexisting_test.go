package supervisor_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/supervisor"
)

// TestUpLeavesExistingVM: up of a VM that exists in a state other than
// running (paused by the user, postmigrate after a migration) leaves it as
// it is: same QEMU, same state, records kept, and the note says what to do.
// It used to fail the confirm step and undo the start, killing the guest.
func TestUpLeavesExistingVM(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	dir := t.TempDir()
	sup := newSup(t, "")
	f := migGuest(t, dir, "keep", "256M", filepath.Join(dir, "keep.raw"))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	st, err := sup.Status(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	waitCounterPast(t, st.ConsoleLog, 2, 60*time.Second)

	upAgain := func(wantQEMU, wantNote string) {
		t.Helper()
		res, err := sup.Up(ctx, f)
		if err != nil {
			t.Fatalf("up of a %s VM: %v", wantQEMU, err)
		}
		r := res[0]
		if r.Action != supervisor.Unchanged || r.State != supervisor.StatePaused || !strings.Contains(r.Note, wantNote) {
			t.Fatalf("up of a %s VM: %+v", wantQEMU, r)
		}
		after, err := sup.Status(ctx, "keep")
		if err != nil || after.QEMUStatus != wantQEMU || after.MainPID != st.MainPID {
			t.Fatalf("after up: %+v %v (want QEMU %s, pid %d)", after, err, wantQEMU, st.MainPID)
		}
		if _, err := os.Stat(after.StateDir); err != nil {
			t.Fatalf("state dir gone: %v", err)
		}
		t.Logf("up of a %s VM: %s; %s", wantQEMU, r.Action, r.Note)
	}

	// Paused by the user.
	if err := sup.Pause(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	upAgain("paused", "paused: vmsup resume keep")
	if err := sup.Resume(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	// The guest goes on where it was: the counter advances.
	n := lastCounter(t, st.ConsoleLog)
	waitCounterPast(t, st.ConsoleLog, n+2, 30*time.Second)

	// postmigrate: the state a completed outgoing migration leaves the
	// source in. The stream goes to a socket in the VM's directory (the one
	// place the confined QEMU can reach) and is thrown away.
	sock := filepath.Join(st.StateDir, "drain.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fi, _ := os.Stat(st.StateDir)
	if err := os.Chown(sock, int(fi.Sys().(*syscall.Stat_t).Uid), -1); err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	qmpJSON(t, ctx, sup, `{"execute":"migrate","arguments":{"uri":"unix:`+sock+`"}}`)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var info struct {
			Return struct{ Status string } `json:"return"`
		}
		json.Unmarshal(qmpJSON(t, ctx, sup, `{"execute":"query-migrate"}`), &info)
		if info.Return.Status == "completed" {
			break
		}
		if info.Return.Status == "failed" || time.Now().After(deadline) {
			t.Fatalf("migration to the drain socket: %s", info.Return.Status)
		}
	}
	upAgain("postmigrate", "postmigrate: a migration of it completed")

	if _, err := sup.Down(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
}

func qmpJSON(t testing.TB, ctx context.Context, sup *supervisor.Supervisor, cmd string) []byte {
	t.Helper()
	out, err := sup.QMP(ctx, "keep", []byte(cmd), false)
	if err != nil {
		t.Fatalf("%s: %s %v", cmd, out, err)
	}
	return out
}
