package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/spec"
)

// qcow2Image is a 1 MiB qcow2 image starting with marker, and its sha256.
func qcow2Image(t *testing.T, marker string) ([]byte, string) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img is not installed (apt-get install qemu-utils)")
	}
	dir := t.TempDir()
	raw, q := filepath.Join(dir, "d.raw"), filepath.Join(dir, "d.qcow2")
	b := make([]byte, 1<<20)
	copy(b, marker)
	if err := os.WriteFile(raw, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, q).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	data, err := os.ReadFile(q)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:])
}

// TestImagesPulledByDigest: fleet apply records a VM's image as the
// applying host's store has it (digest, source, checksum); an agent whose
// store lacks it pulls it once from the source and sets the VM's alias; a
// source that now serves other bytes, and an alias here that names another
// image, are refused with the disk named; an image the applying host lacks
// is refused at apply.
func TestImagesPulledByDigest(t *testing.T) {
	img, sum := qcow2Image(t, "FLEET-IMAGE")
	other, otherSum := qcow2Image(t, "OTHER-IMAGE")
	var served atomic.Value
	served.Store(img)
	var gets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		http.ServeContent(w, r, "d.qcow2", time.Time{}, strings.NewReader(string(served.Load().([]byte))))
	}))
	defer srv.Close()
	ctx := context.Background()
	store := func() imagestore.Store { return imagestore.Store{Dir: filepath.Join(t.TempDir(), "image-store")} }
	applier := store()
	if _, err := applier.Pull(ctx, imagestore.Pull{Source: srv.URL + "/d.qcow2", SHA256: sum, Name: "tiny"}); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Parse("/vms/v.toml", []byte("name = \"v\"\nmemory = \"128M\"\n[[disk]]\nname = \"root\"\nfile = \"/vms/v.qcow2\"\nimage = \"tiny\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	refs, err := ResolveImages(applier, f)
	want := ImageRef{Disk: "root", Ref: "tiny", Digest: "sha256:" + sum, Source: srv.URL + "/d.qcow2", Verified: "sha256:" + sum}
	if err != nil || len(refs) != 1 || refs[0] != want {
		t.Fatalf("ResolveImages: %+v %v, want %+v", refs, err, want)
	}
	if _, err := ResolveImages(store(), f); err == nil || !strings.Contains(err.Error(), "disk[0].image") {
		t.Errorf("an image the applying host lacks: %v", err)
	}

	rec := VMRecord{Name: "v", Images: refs}
	here := store()
	a := &Agent{Images: here, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	before := gets.Load()
	for range 2 {
		if err := a.ensureImages(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if im, err := here.Resolve("tiny"); err != nil || im.Digest != want.Digest {
		t.Errorf("the agent's store: alias tiny is %+v %v, want %s", im, err, want.Digest)
	}
	if n := gets.Load() - before; n != 1 {
		t.Errorf("the image was fetched %d times for two starts, want once", n)
	}

	served.Store(other) // the source changed under the same URL
	if err := (&Agent{Images: store(), Log: a.Log}).ensureImages(ctx, rec); err == nil || !strings.Contains(err.Error(), "disk root:") {
		t.Errorf("a source serving other bytes: %v", err)
	}
	elsewhere := store()
	if _, err := elsewhere.Pull(ctx, imagestore.Pull{Source: srv.URL + "/other.qcow2", SHA256: otherSum, Name: "tiny"}); err != nil {
		t.Fatal(err)
	}
	served.Store(img)
	err = (&Agent{Images: elsewhere, Log: a.Log}).ensureImages(ctx, rec)
	if err == nil || !strings.Contains(err.Error(), `image "tiny" is sha256:`+otherSum+" on this host") {
		t.Errorf("an alias here naming another image: %v", err)
	}
}

// TestPlacementWhereImagesAre: each agent publishes the digests its store
// holds in its host record (at registration, and again once they change);
// the scheduler places a VM standing on a stored image on a host that
// holds it, though another has more free memory, and spreads by memory
// again once both hold it.
func TestPlacementWhereImagesAre(t *testing.T) {
	img, sum := qcow2Image(t, "FLEET-IMAGE")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "d.qcow2", time.Time{}, strings.NewReader(string(img)))
	}))
	defer srv.Close()
	ctx := t.Context()
	s := newStore(t)
	pull := func(st imagestore.Store) {
		t.Helper()
		if _, err := st.Pull(ctx, imagestore.Pull{Source: srv.URL + "/d.qcow2", SHA256: sum, Name: "tiny"}); err != nil {
			t.Fatal(err)
		}
	}
	store := func() imagestore.Store { return imagestore.Store{Dir: filepath.Join(t.TempDir(), "image-store")} }
	applier, big, small := store(), store(), store()
	pull(applier)
	pull(small)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	agents := map[string]*Agent{}
	for name, st := range map[string]imagestore.Store{"big": big, "small": small} {
		mem := map[string]int64{"big": 4 * gib, "small": gib}[name]
		a := &Agent{Store: s, Host: Host{Name: name, CPUs: 4, Memory: mem}, State: t.TempDir(), Images: st, Log: log}
		a.init()
		if err := a.register(ctx); err != nil {
			t.Fatal(err)
		}
		agents[name] = a
	}
	hostImages := func(host string) []string {
		snap, err := s.Load(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Hosts[host].Images
	}
	if got := hostImages("small"); len(got) != 1 || got[0] != "sha256:"+sum {
		t.Fatalf("small's record lists %v, want the image it holds", got)
	}
	if got := hostImages("big"); len(got) != 0 {
		t.Fatalf("big's record lists %v, want none", got)
	}
	place := func(vm string) string {
		t.Helper()
		f, err := spec.Parse("/vms/"+vm+".toml", fmt.Appendf(nil, "name = %q\nmemory = \"128M\"\n[[disk]]\nname = \"root\"\nfile = \"/vms/%s.qcow2\"\nimage = \"tiny\"\n", vm, vm))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.ApplyImages(ctx, func(f *spec.File) ([]ImageRef, error) { return ResolveImages(applier, f) }, f); err != nil {
			t.Fatal(err)
		}
		if err := (&Scheduler{Store: s, Log: log}).Pass(ctx); err != nil {
			t.Fatal(err)
		}
		snap, err := s.Load(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Placements[vm].Value.Host
	}
	if h := place("v1"); h != "small" {
		t.Errorf("v1 placed on %q, want small (it holds the image; big would pull it)", h)
	}
	pull(big) // by hand, or for a VM: the agent's next pass publishes it
	if err := agents["big"].publishImages(ctx); err != nil {
		t.Fatal(err)
	}
	if got := hostImages("big"); len(got) != 1 || got[0] != "sha256:"+sum {
		t.Fatalf("big's record lists %v after the pull, want the image", got)
	}
	if h := place("v2"); h != "big" {
		t.Errorf("v2 placed on %q, want big (both hold the image: the most free memory)", h)
	}
}
