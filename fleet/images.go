package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/spec"
)

// ImageRef is a stored image a VM's file disk stands on (disk.image), as
// the host that applied the VM resolved it: every host runs the VM on the
// same bytes, and a host whose store lacks them pulls them by digest.
type ImageRef struct {
	Disk   string `json:"disk"`
	Ref    string `json:"ref"`    // as the VM file names it: an alias or sha256:HEX
	Digest string `json:"digest"` // sha256:HEX of the image file
	Source string `json:"source"` // the URL or OCI reference it was pulled from
	// Verified is the checksum an HTTP pull was checked against
	// ("sha256:HEX" or "sha512:HEX"); an OCI pull checks digests itself.
	Verified string `json:"verified,omitempty"`
}

// ImageStore is a host's image store as the fleet uses it
// (imagestore.Store is one).
type ImageStore interface {
	Resolve(ref string) (imagestore.Image, error)
	Pull(ctx context.Context, p imagestore.Pull) (imagestore.Image, error)
	SetAlias(ctx context.Context, alias, digest string) error
	List() ([]imagestore.Image, error)
}

// ResolveImages is what fleet apply records of f's images: each file
// disk's image as store (the applying host's) has it. An image it lacks,
// or one with no source other hosts could pull, is refused naming the disk.
func ResolveImages(store ImageStore, f *spec.File) ([]ImageRef, error) {
	var out []ImageRef
	for i, d := range f.VM.Disks {
		if d.Type != spec.DiskFile || d.Image == "" {
			continue
		}
		field := fmt.Sprintf("disk[%d].image", i)
		im, err := store.Resolve(d.Image)
		if err != nil {
			return nil, f.Errorf(field, "%v: the fleet records a VM's images (digest and source) from the host that applies it; pull it here first", err)
		}
		if im.Source == "" {
			return nil, f.Errorf(field, "image %q (%s) has no source the fleet's hosts could pull it from", d.Image, im.Digest)
		}
		out = append(out, ImageRef{Disk: d.Name, Ref: d.Image, Digest: im.Digest, Source: im.Source, Verified: im.Verified})
	}
	return out, nil
}

// ensureImages makes this host's store hold every image rec names before
// the VM's start here: one it lacks is pulled from its source and must
// come out as the recorded digest; an alias the VM names is set to it
// where this store has no such alias, and refused where it names another
// image (the VM would stand on other bytes than the fleet recorded).
func (a *Agent) ensureImages(ctx context.Context, rec VMRecord) error {
	if a.Images == nil {
		return nil
	}
	for _, r := range rec.Images {
		if err := a.ensureImage(ctx, r); err != nil {
			return fmt.Errorf("disk %s: %w", r.Disk, err)
		}
	}
	return nil
}

func (a *Agent) ensureImage(ctx context.Context, r ImageRef) error {
	_, err := a.Images.Resolve(r.Digest)
	if errors.Is(err, imagestore.ErrNotFound) {
		p := imagestore.Pull{Source: r.Source}
		if alg, hex, ok := strings.Cut(r.Verified, ":"); ok && imagestore.IsHTTP(r.Source) {
			switch alg {
			case "sha256":
				p.SHA256 = hex
			case "sha512":
				p.SHA512 = hex
			}
		}
		a.Log.Info("pulling image", "image", r.Digest, "source", r.Source)
		im, perr := a.Images.Pull(ctx, p)
		switch {
		case perr != nil:
			return fmt.Errorf("pull image %s from %s: %w", r.Digest, r.Source, perr)
		case im.Digest != r.Digest:
			return fmt.Errorf("%s gave image %s, not the %s the fleet recorded for %q", r.Source, im.Digest, r.Digest, r.Ref)
		}
		err = nil
	}
	if err != nil {
		return fmt.Errorf("image %s: %w", r.Digest, err)
	}
	if r.Ref == r.Digest {
		return nil
	}
	cur, err := a.Images.Resolve(r.Ref)
	switch {
	case err == nil && cur.Digest != r.Digest:
		return fmt.Errorf("image %q is %s on this host, but the fleet recorded %s for the VM: apply the VM with image = %q", r.Ref, cur.Digest, r.Digest, r.Digest)
	case err == nil:
		return nil
	case errors.Is(err, imagestore.ErrNotFound):
		return a.Images.SetAlias(ctx, r.Ref, r.Digest)
	}
	return err
}

// storeDigests are the digests this host's store holds, sorted (none
// without a store; on an error too: the host then looks like one that
// would pull, which costs time, not correctness).
func (a *Agent) storeDigests() []string {
	if a.Images == nil {
		return nil
	}
	ims, err := a.Images.List()
	if err != nil {
		a.Log.Warn("image store", "err", err)
		return nil
	}
	var out []string
	for _, im := range ims {
		out = append(out, im.Digest)
	}
	slices.Sort(out)
	return out
}

// publishImages puts the host's record again, under its lease, when its
// store's images changed since (a pull for a VM, an image pull or rm by
// hand): the scheduler places VMs where their images are.
func (a *Agent) publishImages(ctx context.Context) error {
	d := a.storeDigests()
	a.mu.Lock()
	h := a.record
	a.mu.Unlock()
	if h.Name == "" || slices.Equal(d, h.Images) {
		return nil
	}
	h.Images = d
	k := a.Store.key("hosts", h.Name)
	cctx, cancel := a.Store.ctx(ctx)
	defer cancel()
	id := clientv3.LeaseID(h.Lease)
	r, err := a.Store.Client().Txn(cctx).If(clientv3.Compare(clientv3.LeaseValue(k), "=", id)).
		Then(clientv3.OpPut(k, mustJSON(h), clientv3.WithLease(id))).Commit()
	if err != nil {
		return fmt.Errorf("host %s: publish its images: %w", h.Name, a.Store.explain(err))
	}
	if r.Succeeded { // else the lease is gone: register puts the record anew
		a.mu.Lock()
		a.record = h
		a.mu.Unlock()
	}
	return nil
}
