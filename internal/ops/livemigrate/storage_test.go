package livemigrate

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
)

// testEnv is a real environment over root (it connects to systemd only
// when asked, and nothing here asks).
func testEnv(t *testing.T, root string) *machine.Env {
	t.Helper()
	env, err := machine.New(machine.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// TestRegisterKinds: both sides of a migration, with and without disk
// copies, have their recovery; a kind without one cannot begin.
func TestRegisterKinds(t *testing.T) {
	dir := t.TempDir()
	k := operation.New(operation.Options{Store: vmstore.Store{Root: dir}})
	Register(k, testEnv(t, dir))
	want := []operation.Kind{KindOut, KindIn, KindInStorage, KindOutStorage, KindMove, KindInMove}
	slices.Sort(want)
	if got := k.Kinds(); !slices.Equal(got, want) {
		t.Fatalf("registered %v, want %v", got, want)
	}
	if _, err := k.Begin(context.Background(), "web", "migrate-something-else", nil); !errors.Is(err, operation.ErrUnregistered) {
		t.Fatalf("an unregistered kind began: %v", err)
	}
}

// TestMirrorsState: the copies are ready only when every job is; a job
// that ended, was cancelled or vanished is the copy's failure.
func TestMirrorsState(t *testing.T) {
	copies := []migwire.DiskCopy{{Name: "data"}, {Name: "logs"}}
	job := func(disk string, st qmp.JobStatus, done, total int64, e string) qmp.Job {
		return qmp.Job{ID: mirrorJob(disk), Type: "mirror", Status: st, CurrentProgress: done, TotalProgress: total, Error: e}
	}
	ready, done, total, err := mirrorsState([]qmp.Job{job("data", qmp.JobReady, 10, 10, ""), job("logs", qmp.JobRunning, 5, 20, "")}, copies)
	if ready || done != 15 || total != 30 || err != nil {
		t.Fatalf("one running: %v %d/%d %v", ready, done, total, err)
	}
	if ready, _, _, err = mirrorsState([]qmp.Job{job("data", qmp.JobReady, 10, 10, ""), job("logs", qmp.JobReady, 20, 20, "")}, copies); !ready || err != nil {
		t.Fatalf("both ready: %v %v", ready, err)
	}
	if _, _, _, err = mirrorsState([]qmp.Job{job("data", qmp.JobConcluded, 1, 10, errJobCancelled), job("logs", qmp.JobReady, 1, 1, "")}, copies); err != migwire.ErrCancelled {
		t.Fatalf("cancelled: %v", err)
	}
	if _, _, _, err = mirrorsState([]qmp.Job{job("data", qmp.JobConcluded, 1, 10, "Input/output error"), job("logs", qmp.JobReady, 1, 1, "")}, copies); err == nil || !strings.Contains(err.Error(), `disk "data": copy to the destination failed: Input/output error`) {
		t.Fatalf("failed: %v", err)
	}
	if _, _, _, err = mirrorsState([]qmp.Job{job("data", qmp.JobReady, 1, 1, "")}, copies); err == nil || !strings.Contains(err.Error(), "is gone") {
		t.Fatalf("vanished: %v", err)
	}
	if n := mirrorTarget("a-disk-name-that-is-long-enough"); len(n) > 31 {
		t.Fatalf("node name %q is longer than QEMU's 31", n)
	}
}

// TestPlanCopies: a disk whose marker the destination sees is shared (no
// copy); one it does not see is copied whole, or refused when its path
// exists here or its stored image is not in this host's store (an empty
// one here).
func TestPlanCopies(t *testing.T) {
	dir := t.TempDir()
	d := &incomingVM{mg: New(operation.New(operation.Options{Store: vmstore.Store{Root: dir}}), testEnv(t, dir))}
	shared, mk := filepath.Join(dir, "shared.qcow2"), filepath.Join(dir, ".marker")
	os.WriteFile(mk, nil, 0o600)
	local := filepath.Join(dir, "local.qcow2")
	m := migwire.Msg{Markers: map[string]string{shared: mk, local: filepath.Join(dir, ".gone")},
		Disks: []migwire.DiskCopy{{Name: "s", File: shared, Format: "qcow2", Size: 1 << 20}, {Name: "l", File: local, Format: "qcow2", Size: 1 << 20}}}
	got, err := d.planCopies(context.Background(), m)
	if err != nil || len(got) != 1 || got[0].Name != "l" || got[0].Sync != "full" || got[0].Export != "l" {
		t.Fatalf("plan: %+v %v", got, err)
	}
	m.Disks[1].Image = "sha256:" + strings.Repeat("a", 64)
	if _, err := d.planCopies(context.Background(), m); err == nil || !strings.Contains(err.Error(), "vmsup image pull it here first") {
		t.Fatalf("missing image: %v", err)
	}
	pullByDigest(t, d, m)
	m.Disks[1].Image = ""
	os.WriteFile(local, nil, 0o600)
	if _, err := d.planCopies(context.Background(), m); err == nil || !strings.Contains(err.Error(), "exists on this host but is not the source's") {
		t.Fatalf("existing file: %v", err)
	}
}

// TestRemoveSourceCopies: after the switch the copied disks' images here
// go, unless kept (--keep-source-disks).
func TestRemoveSourceCopies(t *testing.T) {
	dir := t.TempDir()
	mg := New(operation.New(operation.Options{Store: vmstore.Store{Root: dir}}), testEnv(t, dir))
	f := filepath.Join(dir, "data.qcow2")
	os.WriteFile(f, nil, 0o600)
	if note := mg.removeSourceCopies("web", []string{f}, true); note != "" || !exists(f) {
		t.Fatalf("kept: %q, there %v", note, exists(f))
	}
	if note := mg.removeSourceCopies("web", []string{f, filepath.Join(dir, "gone.qcow2")}, false); exists(f) || !strings.Contains(note, "removed") {
		t.Fatalf("removed: %q, there %v", note, exists(f))
	}
}

// pullByDigest: a stored image missing here is pulled from the source its
// store recorded (HTTP, checked against the digest), then copied top
// layer only; a source that serves other bytes is refused.
func pullByDigest(t *testing.T, d *incomingVM, m migwire.Msg) {
	t.Helper()
	data := make([]byte, 1<<20)
	rand.Read(data)
	sum := sha256.Sum256(data)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/other.raw" {
			w.Write(make([]byte, 1<<20))
			return
		}
		w.Write(data)
	}))
	defer srv.Close()
	m.Disks[1].Image = "sha256:" + hex.EncodeToString(sum[:])
	m.Disks[1].ImageSource = srv.URL + "/other.raw"
	if _, err := d.planCopies(context.Background(), m); err == nil || !strings.Contains(err.Error(), "pulling it from "+srv.URL+"/other.raw failed") {
		t.Fatalf("pull of other bytes: %v", err)
	}
	m.Disks[1].ImageSource = srv.URL + "/base.raw"
	got, err := d.planCopies(context.Background(), m)
	if err != nil || len(got) != 1 || got[0].Sync != "top" || got[0].BackingFormat != "raw" {
		t.Fatalf("plan with the image pulled by digest: %+v %v", got, err)
	}
	if im, err := d.mg.env.Images().Store.Resolve(m.Disks[1].Image); err != nil || im.Source != m.Disks[1].ImageSource {
		t.Fatalf("the pulled image in the store: %+v %v", im, err)
	}
}
