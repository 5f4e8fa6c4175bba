// Package imagestore is vmsup's image store: disk images pulled from
// HTTP(S) URLs or OCI registries, verified (checksum or digest, then
// qemu-img: a qcow2 or raw image with no backing file and no external data
// file), and kept content-addressed by the sha256 of the image file under
// the state root (ROOT/image-store/sha256/HEX), read-only for everyone
// (0644, root's), with aliases ("debian-12" -> sha256:HEX). A VM's disk
// uses one through `image = "debian-12"`: its file is made, at the first
// start, a qcow2 overlay on the stored image (Start, a start contributor).
//
// It owns the store's layout, pulls, aliases and the removal rule (an image
// a VM's disk or snapshot chain uses stays: Users). It does not know the
// VM lifecycle; the host-path rule (hostpaths.Places.Store) keeps VM files
// from opening a stored image writable.
package imagestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// ErrNotFound: no image by that alias or digest.
var ErrNotFound = errors.New("no such image in the store")

// ErrInUse: the image backs a VM's disk.
var ErrInUse = errors.New("image in use")

// Dir is the store's directory under the state root.
func Dir(root string) string { return filepath.Join(root, "image-store") }

// Store is the image store at Dir.
type Store struct {
	Dir   string
	Tools storage.Tools
	// MaxVirtualSize bounds the virtual size of an image the store takes
	// (bytes; 0: DefaultMaxVirtualSize): a small download may claim a
	// huge disk, and a VM's overlay on it grows up to that size on the host.
	MaxVirtualSize int64
	// ScanDirs are the image directories whose qcow2 files Users reads
	// for overlays on stored images (a removed VM's kept disk).
	ScanDirs []string
}

// DefaultMaxVirtualSize is the store's bound without MaxVirtualSize.
const DefaultMaxVirtualSize int64 = 4 << 40

// Image is one stored image.
type Image struct {
	Digest      string    `json:"digest"` // "sha256:HEX" of the image file
	Format      string    `json:"format"` // qcow2 or raw
	VirtualSize int64     `json:"virtual_size"`
	Size        int64     `json:"size"`
	Source      string    `json:"source"` // the URL or OCI reference pulled
	Verified    string    `json:"verified,omitempty"`
	Pulled      time.Time `json:"pulled"`
	Aliases     []string  `json:"aliases,omitempty"` // filled by List
	Path        string    `json:"path"`
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// IsDigest reports whether ref is a digest ("sha256:" and 64 hex digits).
func IsDigest(ref string) bool { return digestRE.MatchString(ref) }

// CheckAlias refuses an alias that is not a name.
func CheckAlias(a string) error {
	if err := spec.ValidName(a); err != nil {
		return fmt.Errorf("alias: %w", err)
	}
	return nil
}

func (s Store) blobDir() string    { return filepath.Join(s.Dir, "sha256") }
func (s Store) metaDir() string    { return filepath.Join(s.Dir, "meta") }
func (s Store) partialDir() string { return filepath.Join(s.Dir, "partial") }
func (s Store) aliasFile() string  { return filepath.Join(s.Dir, "aliases.json") }

// Path is where the image of digest lies.
func (s Store) Path(digest string) string {
	return filepath.Join(s.blobDir(), strings.TrimPrefix(digest, "sha256:"))
}

func (s Store) metaPath(digest string) string {
	return filepath.Join(s.metaDir(), strings.TrimPrefix(digest, "sha256:")+".json")
}

// init makes the store's directories: the store and its blobs searchable
// and readable by QEMU's users, the rest root's.
func (s Store) init() error {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{s.Dir, 0o755}, {s.blobDir(), 0o755}, {s.metaDir(), 0o700}, {s.partialDir(), 0o700}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return fmt.Errorf("image store: %w", err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return fmt.Errorf("image store: %w", err)
		}
	}
	return nil
}

// lock takes the store's lock for aliases and removals (pulls take their
// own per-source lock and this one only to publish).
func (s Store) lock(ctx context.Context) (*vmstore.FileLock, error) {
	if err := s.init(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, ok, err := vmstore.LockFile(ctx, filepath.Join(s.Dir, ".lock"), true)
	if err != nil {
		return nil, fmt.Errorf("image store: lock: %w", err)
	}
	if !ok {
		return nil, fmt.Errorf("image store: lock: %w", ctx.Err())
	}
	return l, nil
}

func (s Store) aliases() (map[string]string, error) {
	m := map[string]string{}
	b, err := os.ReadFile(s.aliasFile())
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", s.aliasFile(), err)
	}
	return m, nil
}

func (s Store) writeAliases(m map[string]string) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.aliasFile(), append(b, '\n'), 0o644)
}

// SetAlias points alias at digest (which must be stored).
func (s Store) SetAlias(ctx context.Context, alias, digest string) error {
	if err := CheckAlias(alias); err != nil {
		return err
	}
	if _, err := os.Stat(s.Path(digest)); err != nil {
		return fmt.Errorf("alias %q: %s: %w", alias, digest, ErrNotFound)
	}
	l, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer l.Unlock()
	m, err := s.aliases()
	if err != nil {
		return err
	}
	m[alias] = digest
	return s.writeAliases(m)
}

// Resolve finds the image ref names: an alias or a digest.
func (s Store) Resolve(ref string) (Image, error) {
	digest := ref
	if !IsDigest(ref) {
		m, err := s.aliases()
		if err != nil {
			return Image{}, err
		}
		var ok bool
		if digest, ok = m[ref]; !ok {
			return Image{}, fmt.Errorf("image %q: %w (vmsup image pull SOURCE --name %s)", ref, ErrNotFound, ref)
		}
	}
	im, err := s.read(digest)
	if err != nil {
		return Image{}, fmt.Errorf("image %q: %w", ref, err)
	}
	return im, nil
}

func (s Store) read(digest string) (Image, error) {
	b, err := os.ReadFile(s.metaPath(digest))
	if errors.Is(err, os.ErrNotExist) {
		return Image{}, fmt.Errorf("%s: %w", digest, ErrNotFound)
	}
	if err != nil {
		return Image{}, err
	}
	var im Image
	if err := json.Unmarshal(b, &im); err != nil {
		return Image{}, fmt.Errorf("%s: %w", s.metaPath(digest), err)
	}
	if _, err := os.Stat(s.Path(digest)); err != nil {
		return Image{}, fmt.Errorf("%s: %w", digest, ErrNotFound)
	}
	im.Path = s.Path(digest)
	return im, nil
}

// List is every stored image, with its aliases, by digest.
func (s Store) List() ([]Image, error) {
	ents, err := os.ReadDir(s.metaDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m, err := s.aliases()
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, e := range ents {
		hex, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		im, err := s.read("sha256:" + hex)
		if err != nil {
			continue
		}
		for a, d := range m {
			if d == im.Digest {
				im.Aliases = append(im.Aliases, a)
			}
		}
		sort.Strings(im.Aliases)
		out = append(out, im)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Digest < out[j].Digest })
	return out, nil
}

// UsersFunc says which VMs use each stored image (by path): Users.
type UsersFunc func(ctx context.Context) (map[string][]string, error)

// Remove removes the image ref names (an alias drops only that alias while
// others point at the image, unless all is set), refusing one a VM uses:
// "image "debian-12" (sha256:...) is in use by VM "web" (disk "root")".
func (s Store) Remove(ctx context.Context, ref string, users UsersFunc) (removed []string, err error) {
	im, err := s.Resolve(ref)
	if err != nil {
		return nil, err
	}
	l, err := s.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	m, err := s.aliases()
	if err != nil {
		return nil, err
	}
	if !IsDigest(ref) {
		others := 0
		for a, d := range m {
			if d == im.Digest && a != ref {
				others++
			}
		}
		if others > 0 { // the image stays, under its other names
			delete(m, ref)
			return []string{ref}, s.writeAliases(m)
		}
	}
	u, err := users(ctx)
	if err != nil {
		return nil, fmt.Errorf("image %q: looking for its users: %w", ref, err)
	}
	if who := u[im.Path]; len(who) > 0 {
		return nil, fmt.Errorf("image %q (%s): %w by %s: remove or re-image those disks first", ref, im.Digest, ErrInUse, strings.Join(who, ", "))
	}
	for a, d := range m {
		if d == im.Digest {
			delete(m, a)
		}
	}
	if err := s.writeAliases(m); err != nil {
		return nil, err
	}
	if err := errors.Join(os.Remove(s.Path(im.Digest)), os.Remove(s.metaPath(im.Digest))); err != nil {
		return nil, err
	}
	return []string{im.Digest}, nil
}

// Pruned is what Prune did: the images it removed, the partial downloads
// it removed ("partial KEY.part"), and the images it kept, with why.
type Pruned struct {
	Removed  []Image
	Partials []string
	Kept     []KeptImage
}

// KeptImage is an image prune left: the aliases naming it and the VMs
// using it (either is enough to keep it).
type KeptImage struct {
	Image
	UsedBy []string
}

// Freed is the space the removed images took.
func (p Pruned) Freed() int64 {
	var n int64
	for _, im := range p.Removed {
		n += im.Size
	}
	return n
}

// Prune removes the images no alias names and no VM uses, and the partial
// downloads no pull is working on.
func (s Store) Prune(ctx context.Context, users UsersFunc) (Pruned, error) {
	var out Pruned
	l, err := s.lock(ctx)
	if err != nil {
		return out, err
	}
	defer l.Unlock()
	u, err := users(ctx)
	if err != nil {
		return out, err
	}
	ims, err := s.List()
	if err != nil {
		return out, err
	}
	for _, im := range ims {
		if len(im.Aliases) > 0 || len(u[im.Path]) > 0 {
			out.Kept = append(out.Kept, KeptImage{Image: im, UsedBy: u[im.Path]})
			continue
		}
		if err := errors.Join(os.Remove(im.Path), os.Remove(s.metaPath(im.Digest))); err != nil {
			return out, err
		}
		out.Removed = append(out.Removed, im)
	}
	out.Partials = s.prunePartials(ctx)
	return out, nil
}

// prunePartials removes partial downloads whose lock no pull holds.
func (s Store) prunePartials(ctx context.Context) []string {
	ents, _ := os.ReadDir(s.partialDir())
	var out []string
	for _, e := range ents {
		key, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok {
			continue
		}
		l, held, err := vmstore.LockFile(ctx, filepath.Join(s.partialDir(), e.Name()), false)
		if err != nil || !held {
			continue
		}
		for _, suffix := range []string{".part", ".json"} {
			if os.Remove(filepath.Join(s.partialDir(), key+suffix)) == nil {
				out = append(out, "partial "+key+suffix)
			}
		}
		os.Remove(filepath.Join(s.partialDir(), e.Name()))
		l.Unlock()
	}
	slices.Sort(out)
	return out
}
