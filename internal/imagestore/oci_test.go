package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// StartTestRegistry starts docker-registry on loopback for one test, or
// skips it saying why.
func StartTestRegistry(t testing.TB) *testenv.Registry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := testenv.StartRegistry(ctx, t.TempDir())
	if err != nil {
		t.Skipf("no OCI registry: %v", err)
	}
	t.Cleanup(func() { r.Stop() })
	return r
}

// PushContainerDisk pushes a containerDisk (disk under /disk/ in one
// gzip layer) with the disk bytes to the registry as repo: its reference
// and the layer's digest.
func PushContainerDisk(t testing.TB, r *testenv.Registry, repo string, disk []byte) (ref, layerDigest string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "disk/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "disk/disk.qcow2", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(disk))})
	tw.Write(disk)
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	ref = r.Addr + "/" + repo + ":1"
	nref, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(nref, img); err != nil {
		t.Fatal(err)
	}
	d, _ := layer.Digest()
	return ref, d.String()
}

// A containerDisk from a real registry is stored by its disk's sha256; a
// blob changed in the registry is refused and leaves nothing.
func TestPullOCI(t *testing.T) {
	r := StartTestRegistry(t)
	img, sum := testImage(t, "VMSUP-IMAGE-OCI")
	ref, layer := PushContainerDisk(t, r, "disks/guest", img)
	ctx := context.Background()
	s := newStore(t)
	im, err := s.Pull(ctx, Pull{Source: ref, Insecure: true, Name: "oci"})
	if err != nil {
		t.Fatal(err)
	}
	if im.Digest != "sha256:"+sum || im.Format != "qcow2" {
		t.Errorf("pulled %+v, want sha256:%s", im, sum)
	}
	// Again: found by its manifest digest, not fetched.
	if again, err := s.Pull(ctx, Pull{Source: ref, Insecure: true}); err != nil || again.Digest != im.Digest {
		t.Errorf("second pull: %v %v", again.Digest, err)
	}

	// The registry's copy of the layer changes (same size): refused.
	b, err := os.ReadFile(r.Blob(layer))
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(r.Blob(layer), b, 0o644); err != nil {
		t.Fatal(err)
	}
	s2 := newStore(t)
	_, err = s2.Pull(ctx, Pull{Source: ref, Insecure: true, Name: "oci"})
	if err == nil {
		t.Fatal("a changed blob was accepted")
	}
	t.Logf("changed blob: %v", err)
	if l := leftover(t, s2); len(l) > 0 {
		t.Errorf("changed blob left %v", l)
	}
	if _, err := s2.Resolve("oci"); !errors.Is(err, ErrNotFound) {
		t.Errorf("alias after a refused pull: %v", err)
	}
}
