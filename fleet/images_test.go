package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
