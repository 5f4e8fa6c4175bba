package imagestore

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// Pull is one pull: a source, what it must hash to, and where to report.
type Pull struct {
	// Source is an http:// or https:// URL, or an OCI reference
	// ("registry:5000/disks/debian:12", "...@sha256:HEX"; a "docker://"
	// prefix is allowed).
	Source string
	// SHA256 or SHA512 (hex) is what an HTTP download must hash to; or
	// SumsURL, a SHA256SUMS file naming the URL's file. An OCI pull is
	// checked against the registry's digests instead.
	SHA256, SHA512, SumsURL string
	// Name is an alias to set on the image.
	Name string
	// Insecure lets an OCI pull use plain HTTP (a registry on loopback).
	Insecure bool
	// Client is the HTTP client (nil: http.DefaultClient).
	Client *http.Client
	// Progress, when set, is told how the download goes.
	Progress func(Progress)
}

// Progress is how far a pull is: Phase "download", "verify" or "done".
type Progress struct {
	Phase  string `json:"phase"`
	Source string `json:"source"`
	Done   int64  `json:"done"`
	Total  int64  `json:"total"` // 0 when unknown
	Digest string `json:"digest,omitempty"`
}

func (p *Pull) report(phase string, done, total int64) {
	if p.Progress != nil {
		p.Progress(Progress{Phase: phase, Source: p.Source, Done: done, Total: total})
	}
}

// IsHTTP reports whether source is an HTTP(S) URL (else an OCI reference).
func IsHTTP(source string) bool {
	return strings.HasPrefix(source, "http://") || strings.HasPrefix(source, "https://")
}

// lockWait bounds the wait for another pull of the same source.
const lockWait = 6 * time.Hour

// Pull fetches p.Source into the store, once: a second pull of the same
// source (and checksum) waits for the first and finds its image. An
// interrupted HTTP download is resumed by the next pull (a Range request
// into the partial file, the whole file checked at the end); a download
// that does not hash as it must, or an image qemu-img refuses, leaves
// nothing in the store.
func (s Store) Pull(ctx context.Context, p Pull) (Image, error) {
	if p.Name != "" {
		if err := CheckAlias(p.Name); err != nil {
			return Image{}, err
		}
	}
	if err := s.init(); err != nil {
		return Image{}, err
	}
	if p.Client == nil {
		p.Client = http.DefaultClient
	}
	var (
		im  Image
		err error
	)
	if IsHTTP(p.Source) {
		im, err = s.pullHTTP(ctx, &p)
	} else {
		im, err = s.pullOCI(ctx, &p)
	}
	if err != nil {
		return Image{}, fmt.Errorf("pull %s: %w", p.Source, err)
	}
	if p.Name != "" {
		if err := s.SetAlias(ctx, p.Name, im.Digest); err != nil {
			return Image{}, err
		}
		im.Aliases = append(im.Aliases, p.Name)
	}
	if p.Progress != nil {
		p.Progress(Progress{Phase: "done", Source: p.Source, Done: im.Size, Total: im.Size, Digest: im.Digest})
	}
	return im, nil
}

// partial is one source's download in progress: its lock, data and the
// validators of what was fetched so far.
type partial struct{ lock, data, meta string }

func (s Store) partialFor(source, want string) partial {
	sum := sha256.Sum256([]byte(source + "\n" + want))
	base := filepath.Join(s.partialDir(), hex.EncodeToString(sum[:16]))
	return partial{lock: base + ".lock", data: base + ".part", meta: base + ".json"}
}

func (pt partial) remove() {
	os.Remove(pt.data)
	os.Remove(pt.meta)
}

// take waits for the source's lock (another pull of it).
func (pt partial) take(ctx context.Context) (*vmstore.FileLock, error) {
	ctx, cancel := context.WithTimeout(ctx, lockWait)
	defer cancel()
	l, ok, err := vmstore.LockFile(ctx, pt.lock, true)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("waiting for another pull of it: %w", ctx.Err())
	}
	return l, nil
}

// bySource is a stored image pulled from source and verified as verified.
func (s Store) bySource(source, verified string) (Image, bool) {
	ims, _ := s.List()
	for _, im := range ims {
		if im.Source == source && (verified == "" || im.Verified == verified) {
			return im, true
		}
	}
	return Image{}, false
}

// validators are what the server said of the partial file's first bytes.
type validators struct {
	URL          string `json:"url"`
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
}

func (s Store) pullHTTP(ctx context.Context, p *Pull) (Image, error) {
	want, err := p.expected(ctx)
	if err != nil {
		return Image{}, err
	}
	pt := s.partialFor(p.Source, want)
	l, err := pt.take(ctx)
	if err != nil {
		return Image{}, err
	}
	defer l.Unlock()
	if im, ok := s.bySource(p.Source, want); ok {
		return im, nil // another pull fetched it while this one waited
	}
	if err := s.download(ctx, p, pt); err != nil {
		return Image{}, err
	}
	p.report("verify", 0, 0)
	if err := checkSum(pt.data, want); err != nil {
		pt.remove()
		return Image{}, err
	}
	im, err := s.add(ctx, pt.data, p.Source, want)
	pt.remove()
	return im, err
}

// expected is the checksum a download must have: "sha256:HEX" or
// "sha512:HEX".
func (p *Pull) expected(ctx context.Context) (string, error) {
	switch {
	case p.SHA256 != "" && p.SHA512 != "":
		return "", errors.New("give --sha256 or --sha512, not both")
	case p.SHA256 != "":
		return checkHex("sha256", p.SHA256, sha256.Size)
	case p.SHA512 != "":
		return checkHex("sha512", p.SHA512, sha512.Size)
	case p.SumsURL != "":
		return p.fromSums(ctx)
	}
	return "", errors.New("an HTTP pull needs the image's checksum: --sha256, --sha512 or --sums URL (a SHA256SUMS file)")
}

func checkHex(algo, h string, size int) (string, error) {
	h = strings.ToLower(strings.TrimPrefix(h, algo+":"))
	if b, err := hex.DecodeString(h); err != nil || len(b) != size {
		return "", fmt.Errorf("--%s %q: want %d hex digits", algo, h, 2*size)
	}
	return algo + ":" + h, nil
}

// maxSums bounds a SHA256SUMS file.
const maxSums = 1 << 20

// fromSums finds the URL's file in the SHA256SUMS file at p.SumsURL.
func (p *Pull) fromSums(ctx context.Context) (string, error) {
	u, err := url.Parse(p.Source)
	if err != nil {
		return "", err
	}
	file := path.Base(u.Path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.SumsURL, nil)
	if err != nil {
		return "", err
	}
	resp, err := p.Client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("--sums %s: %s", p.SumsURL, resp.Status)
	}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, maxSums))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && strings.TrimPrefix(f[1], "*") == file {
			return checkHex("sha256", f[0], sha256.Size)
		}
	}
	return "", fmt.Errorf("--sums %s names no file %q", p.SumsURL, file)
}

// download fetches the source into pt.data, resuming what an earlier pull
// left when the server still has the same file (If-Range).
func (s Store) download(ctx context.Context, p *Pull, pt partial) error {
	var v validators
	var have int64
	if b, err := os.ReadFile(pt.meta); err == nil && json.Unmarshal(b, &v) == nil && v.URL == p.Source {
		if st, err := os.Stat(pt.data); err == nil {
			have = st.Size()
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Source, nil)
	if err != nil {
		return err
	}
	if have > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
		if iv := cmpOr(v.ETag, v.LastModified); iv != "" {
			req.Header.Set("If-Range", iv)
		}
	}
	resp, err := p.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	flags := os.O_CREATE | os.O_WRONLY
	switch resp.StatusCode {
	case http.StatusPartialContent:
		flags |= os.O_APPEND
	case http.StatusOK:
		flags |= os.O_TRUNC
		have = 0
	case http.StatusRequestedRangeNotSatisfiable:
		return nil // all there already: the checksum says
	default:
		return fmt.Errorf("%s", resp.Status)
	}
	v = validators{URL: p.Source, ETag: resp.Header.Get("ETag"), LastModified: resp.Header.Get("Last-Modified")}
	b, _ := json.Marshal(v)
	if err := os.WriteFile(pt.meta, b, 0o600); err != nil {
		return err
	}
	f, err := os.OpenFile(pt.data, flags, 0o600)
	if err != nil {
		return err
	}
	total := int64(0)
	if resp.ContentLength > 0 {
		total = have + resp.ContentLength
	}
	w := &counter{w: f, n: have, report: func(n int64) { p.report("download", n, total) }}
	_, err = io.Copy(w, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("interrupted after %d bytes (the next pull resumes): %w", w.n, err)
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// counter counts what goes through it and reports it every reportEvery
// or reportBytes, whichever comes first.
type counter struct {
	w      io.Writer
	n      int64
	last   time.Time
	lastN  int64
	report func(int64)
}

const (
	reportEvery = 200 * time.Millisecond
	reportBytes = 256 << 10
)

func (c *counter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	if now := time.Now(); now.Sub(c.last) >= reportEvery || c.n-c.lastN >= reportBytes {
		c.last, c.lastN = now, c.n
		c.report(c.n)
	}
	return n, err
}

// ErrChecksum: what was fetched does not hash as it must.
var ErrChecksum = errors.New("checksum mismatch")

// checkSum checks the file at path against want ("sha256:HEX").
func checkSum(path, want string) error {
	algo, hexWant, _ := strings.Cut(want, ":")
	var h hash.Hash
	switch algo {
	case "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	default:
		return fmt.Errorf("unknown checksum %q", algo)
	}
	got, err := hashFile(path, h)
	if err != nil {
		return err
	}
	if got != hexWant {
		return fmt.Errorf("%w: want %s:%s, got %s:%s; nothing kept", ErrChecksum, algo, hexWant, algo, got)
	}
	return nil
}

func hashFile(path string, h hash.Hash) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
