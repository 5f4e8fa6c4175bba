package imagestore

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// ErrNoDisk: the OCI image has no disk under /disk.
var ErrNoDisk = errors.New("no qcow2 or raw disk under /disk/ in its layers (the containerDisk layout)")

// pullOCI fetches a containerDisk: the image's manifest (checked against
// the reference's digest when it names one), then its layers, each hashed
// as it is read and checked against the manifest's digest, the last
// layer's file under /disk/ kept.
func (s Store) pullOCI(ctx context.Context, p *Pull) (Image, error) {
	var opts []name.Option
	if p.Insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(strings.TrimPrefix(p.Source, "docker://"), opts...)
	if err != nil {
		return Image{}, err
	}
	var tr http.RoundTripper = http.DefaultTransport
	if p.Client != nil && p.Client.Transport != nil {
		tr = p.Client.Transport
	}
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithTransport(tr))
	if err != nil {
		return Image{}, err
	}
	md, err := img.Digest()
	if err != nil {
		return Image{}, err
	}
	source := ref.Context().Name() + "@" + md.String()
	pt := s.partialFor(source, "")
	l, err := pt.take(ctx)
	if err != nil {
		return Image{}, err
	}
	defer l.Unlock()
	if im, ok := s.bySource(source, ""); ok {
		return im, nil
	}
	defer pt.remove() // nothing of a failed OCI pull is kept
	layers, err := img.Layers()
	if err != nil {
		return Image{}, err
	}
	found := false
	for _, layer := range layers {
		ok, err := extractDisk(layer, pt.data, p)
		if err != nil {
			return Image{}, err
		}
		found = found || ok
	}
	if !found {
		return Image{}, ErrNoDisk
	}
	p.report("verify", 0, 0)
	return s.add(ctx, pt.data, source, md.String())
}

// extractDisk reads one layer to its end, hashing what the registry sent
// against the layer's digest, and writes its file under /disk/ (if any)
// to dst; ok says it had one.
func extractDisk(layer v1.Layer, dst string, p *Pull) (ok bool, err error) {
	want, err := layer.Digest()
	if err != nil {
		return false, err
	}
	size, _ := layer.Size()
	rc, err := layer.Compressed()
	if err != nil {
		return false, err
	}
	defer rc.Close()
	h := sha256.New()
	cnt := &counter{w: h, report: func(n int64) { p.report("download", n, size) }}
	br := bufio.NewReader(io.TeeReader(rc, cnt))
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return false, fmt.Errorf("layer %s: %w", want, err)
		}
		r = gz
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return false, fmt.Errorf("layer %s: %w", want, err)
		}
		clean := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		if hdr.Typeflag != tar.TypeReg || path.Dir(clean) != "disk" {
			continue
		}
		if err := writeFile(dst, tr); err != nil {
			return false, err
		}
		ok = true
	}
	if _, err := io.Copy(io.Discard, br); err != nil { // the rest, for the digest
		return false, fmt.Errorf("layer %s: %w", want, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); want.Algorithm != "sha256" || got != want.String() {
		return false, fmt.Errorf("layer %s: %w: the registry sent %s; nothing kept", want, ErrChecksum, got)
	}
	return ok, nil
}

func writeFile(dst string, r io.Reader) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
