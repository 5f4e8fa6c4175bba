package imagestore

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testImage makes a qcow2 of a 1 MiB raw disk starting with marker (the
// rest random, so the download takes a while): its bytes and sha256.
func testImage(t testing.TB, marker string) ([]byte, string) {
	t.Helper()
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	b := make([]byte, 1<<20)
	if _, err := rand(b); err != nil {
		t.Fatal(err)
	}
	copy(b, marker)
	if err := os.WriteFile(raw, b, 0o644); err != nil {
		t.Fatal(err)
	}
	q := filepath.Join(dir, "disk.qcow2")
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

func rand(b []byte) (int, error) {
	f, err := os.Open("/dev/urandom")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Read(b)
}

// imageServer serves files by path on loopback, slowly (delay per 32 KiB),
// counting the GETs of each path and noting their Range headers.
type imageServer struct {
	*httptest.Server
	mu     sync.Mutex
	files  map[string][]byte
	etags  map[string]string
	hits   map[string]int
	ranges []string
	sent   atomic.Int64
	delay  time.Duration
}

func newImageServer(t testing.TB, delay time.Duration) *imageServer {
	s := &imageServer{files: map[string][]byte{}, etags: map[string]string{}, hits: map[string]int{}, delay: delay}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		b, ok := s.files[r.URL.Path]
		etag := s.etags[r.URL.Path]
		s.hits[r.URL.Path]++
		if rg := r.Header.Get("Range"); rg != "" {
			s.ranges = append(s.ranges, rg)
		}
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("ETag", etag)
		http.ServeContent(slowWriter{w, s}, r, "", time.Time{}, strings.NewReader(string(b)))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *imageServer) put(path string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[path] = b
	sum := sha256.Sum256(b)
	s.etags[path] = `"` + hex.EncodeToString(sum[:8]) + `"`
}

func (s *imageServer) hitsOf(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[path]
}

type slowWriter struct {
	http.ResponseWriter
	s *imageServer
}

func (w slowWriter) Write(b []byte) (int, error) {
	var n int
	for len(b) > 0 {
		c := min(len(b), 32<<10)
		m, err := w.ResponseWriter.Write(b[:c])
		n += m
		w.s.sent.Add(int64(m))
		if err != nil {
			return n, err
		}
		b = b[c:]
		time.Sleep(w.s.delay)
	}
	return n, nil
}

func newStore(t testing.TB) Store { return Store{Dir: filepath.Join(t.TempDir(), "image-store")} }

// served is a test image served at path with delay per 32 KiB, and a new
// store to pull it into.
type served struct {
	img []byte
	sum string
	srv *imageServer
	url string
	s   Store
}

func serve(t testing.TB, marker, path string, delay time.Duration) served {
	img, sum := testImage(t, marker)
	srv := newImageServer(t, delay)
	srv.put(path, img)
	return served{img: img, sum: sum, srv: srv, url: srv.URL + path, s: newStore(t)}
}

// interrupted runs p, cancelled once half of size is fetched: it must fail.
func interrupted(t testing.TB, s Store, p Pull, size int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.Progress = func(pr Progress) {
		if pr.Done > int64(size)/2 {
			cancel()
		}
	}
	if _, err := s.Pull(ctx, p); err == nil {
		t.Fatal("pull not interrupted")
	}
}

// leftover lists what a store holds beyond its directories and lock files.
func leftover(t testing.TB, s Store) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(s.Dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasSuffix(p, ".lock") && filepath.Base(p) != "aliases.json" {
			out = append(out, strings.TrimPrefix(p, s.Dir+"/"))
		}
		return nil
	})
	return out
}

func TestPullHTTPVerifiedStoredReadOnly(t *testing.T) {
	img, sum := testImage(t, "VMSUP-IMAGE-HTTP")
	srv := newImageServer(t, 0)
	srv.put("/d/disk.qcow2", img)
	s512 := sha512.Sum512(img)
	srv.put("/d/SHA256SUMS", []byte(fmt.Sprintf("%s  other.img\n%s *disk.qcow2\n", strings.Repeat("0", 64), sum)))
	ctx := context.Background()
	for _, p := range []Pull{
		{Source: srv.URL + "/d/disk.qcow2", SHA256: sum, Name: "guest"},
		{Source: srv.URL + "/d/disk.qcow2", SHA512: hex.EncodeToString(s512[:]), Name: "guest512"},
		{Source: srv.URL + "/d/disk.qcow2", SumsURL: srv.URL + "/d/SHA256SUMS", Name: "guestsums"},
	} {
		s := newStore(t)
		im, err := s.Pull(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if im.Digest != "sha256:"+sum || im.Format != "qcow2" || im.VirtualSize != 1<<20 {
			t.Errorf("pulled %+v, want sha256:%s qcow2 of 1 MiB", im, sum)
		}
		st, err := os.Stat(s.Path(im.Digest))
		if err != nil || st.Mode().Perm() != 0o644 {
			t.Errorf("stored image: %v, mode %v, want 0644", err, st.Mode())
		}
		if got, err := s.Resolve(p.Name); err != nil || got.Digest != im.Digest {
			t.Errorf("alias %s: %v %v", p.Name, got.Digest, err)
		}
		if got, err := s.Resolve(im.Digest); err != nil || got.Path != s.Path(im.Digest) {
			t.Errorf("digest: %v %v", got.Path, err)
		}
	}
}

// A wrong checksum, a changed file under a partial download and an image
// qemu-img refuses are refused and leave nothing in the store.
func TestPullRefusedLeavesNothing(t *testing.T) {
	img, sum := testImage(t, "VMSUP-IMAGE-A")
	other, _ := testImage(t, "VMSUP-IMAGE-B")
	srv := newImageServer(t, 2*time.Millisecond)
	srv.put("/a.qcow2", img)
	ctx := context.Background()

	s := newStore(t)
	_, err := s.Pull(ctx, Pull{Source: srv.URL + "/a.qcow2", SHA256: strings.Repeat("ab", 32), Name: "x"})
	if !errors.Is(err, ErrChecksum) {
		t.Errorf("wrong checksum: %v, want ErrChecksum", err)
	}
	if l := leftover(t, s); len(l) > 0 {
		t.Errorf("wrong checksum left %v", l)
	}
	if _, err := s.Resolve("x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("alias after a refused pull: %v", err)
	}

	// Half of a, then the server's file changes: the resume's If-Range
	// gets the whole new file, which does not hash as a must.
	p := Pull{Source: srv.URL + "/a.qcow2", SHA256: sum}
	interrupted(t, s, p, len(img))
	srv.put("/a.qcow2", other)
	if _, err := s.Pull(ctx, p); !errors.Is(err, ErrChecksum) {
		t.Errorf("changed file: %v, want ErrChecksum", err)
	}
	if l := leftover(t, s); len(l) > 0 {
		t.Errorf("changed file left %v", l)
	}

	// A qcow2 naming a backing file (/etc/shadow) is no base for a disk.
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw", bad, "1M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	b, _ := os.ReadFile(bad)
	srv.put("/bad.qcow2", b)
	bs := sha256.Sum256(b)
	if _, err := s.Pull(ctx, Pull{Source: srv.URL + "/bad.qcow2", SHA256: hex.EncodeToString(bs[:])}); !errors.Is(err, ErrBadImage) {
		t.Errorf("backing file: %v, want ErrBadImage", err)
	}
	if l := leftover(t, s); len(l) > 0 {
		t.Errorf("bad image left %v", l)
	}
}

// TestPullVirtualSizeBound: a qcow2 of 1 PiB virtual size (a few hundred
// KiB of file) is refused, naming its size and the bound, and leaves
// nothing; a small one is taken; a bound set lower refuses the small one.
func TestPullVirtualSizeBound(t *testing.T) {
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", huge, "1P").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	b, err := os.ReadFile(huge)
	if err != nil {
		t.Fatal(err)
	}
	hs := sha256.Sum256(b)
	small, sum := testImage(t, "VMSUP-IMAGE-SMALL")
	srv := newImageServer(t, 0)
	srv.put("/huge.qcow2", b)
	srv.put("/small.qcow2", small)
	ctx := context.Background()
	s := newStore(t)

	_, err = s.Pull(ctx, Pull{Source: srv.URL + "/huge.qcow2", SHA256: hex.EncodeToString(hs[:]), Name: "huge"})
	want := "pull " + srv.URL + "/huge.qcow2: virtual size 1PiB (1125899906842624 bytes) is over the image store's bound of 4TiB (--max-virtual-size)"
	if !errors.Is(err, ErrTooLarge) || err.Error() != want {
		t.Errorf("1 PiB image: %v\nwant ErrTooLarge: %s", err, want)
	}
	if l := leftover(t, s); len(l) > 0 {
		t.Errorf("the refused image left %v", l)
	}
	if _, err := s.Pull(ctx, Pull{Source: srv.URL + "/small.qcow2", SHA256: sum, Name: "small"}); err != nil {
		t.Errorf("1 MiB image: %v", err)
	}
	s.MaxVirtualSize = 512 << 10
	_, err = s.Pull(ctx, Pull{Source: srv.URL + "/small.qcow2?again", SHA256: sum})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "virtual size 1MiB (1048576 bytes) is over the image store's bound of 512KiB") {
		t.Errorf("1 MiB image over a 512 KiB bound: %v", err)
	}
}

// A pull cancelled halfway resumes where it stopped (a Range request),
// and the result is checked whole.
func TestPullResumes(t *testing.T) {
	sv := serve(t, "VMSUP-IMAGE-R", "/r.qcow2", 5*time.Millisecond)
	img, sum, srv, s := sv.img, sv.sum, sv.srv, sv.s
	p := Pull{Source: sv.url, SHA256: sum}
	interrupted(t, s, p, len(img))
	pt := s.partialFor(p.Source, "sha256:"+sum)
	st, err := os.Stat(pt.data)
	if err != nil || st.Size() == 0 || st.Size() >= int64(len(img)) {
		t.Fatalf("partial download after the interruption: %v %v", st, err)
	}
	firstSent := srv.sent.Load()
	im, err := s.Pull(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if im.Digest != "sha256:"+sum {
		t.Errorf("digest %s", im.Digest)
	}
	want := fmt.Sprintf("bytes=%d-", st.Size())
	if len(srv.ranges) != 1 || srv.ranges[0] != want {
		t.Errorf("resume asked %q, want %q", srv.ranges, want)
	}
	second := srv.sent.Load() - firstSent
	t.Logf("image %d bytes: %d sent before the interruption, %d after (resumed at %d)", len(img), firstSent, second, st.Size())
	if second > int64(len(img))-st.Size()+64<<10 {
		t.Errorf("the resume sent %d bytes, more than the %d missing", second, int64(len(img))-st.Size())
	}
	if l := leftover(t, s); len(l) != 2 { // the image and its record
		t.Errorf("store holds %v, want the image and its record", l)
	}
}

// Two pulls of one image at once download it once.
func TestConcurrentPullsDownloadOnce(t *testing.T) {
	sv := serve(t, "VMSUP-IMAGE-C", "/c.qcow2", 5*time.Millisecond)
	srv, s := sv.srv, sv.s
	var wg sync.WaitGroup
	res := make([]Image, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = s.Pull(context.Background(), Pull{Source: sv.url, SHA256: sv.sum, Name: fmt.Sprintf("c%d", i)})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	if res[0].Digest != res[1].Digest {
		t.Errorf("digests %s, %s", res[0].Digest, res[1].Digest)
	}
	if n := srv.hitsOf("/c.qcow2"); n != 1 {
		t.Errorf("the server was asked %d times, want once", n)
	}
	ims, _ := s.List()
	if len(ims) != 1 || strings.Join(ims[0].Aliases, ",") != "c0,c1" {
		t.Errorf("store: %+v", ims)
	}
}

// rm refuses an image a VM uses, naming it; an alias among others goes
// alone; prune keeps what an alias names.
func TestRemoveRefusedInUse(t *testing.T) {
	sv := serve(t, "VMSUP-IMAGE-U", "/u.qcow2", 0)
	s := sv.s
	ctx := context.Background()
	im, err := s.Pull(ctx, Pull{Source: sv.url, SHA256: sv.sum, Name: "u"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetAlias(ctx, "u2", im.Digest); err != nil {
		t.Fatal(err)
	}
	users := func(context.Context) (map[string][]string, error) {
		return map[string][]string{im.Path: {`VM "web" (disk "root")`}}, nil
	}
	if got, err := s.Remove(ctx, "u2", users); err != nil || len(got) != 1 || got[0] != "u2" {
		t.Errorf("rm of one alias of two: %v %v", got, err)
	}
	_, err = s.Remove(ctx, "u", users)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), `VM "web" (disk "root")`) {
		t.Errorf("rm of an image in use: %v", err)
	}
	if pr, err := s.Prune(ctx, users); err != nil || len(pr.Removed)+len(pr.Partials) != 0 || len(pr.Kept) != 1 || len(pr.Kept[0].UsedBy) != 1 {
		t.Errorf("prune: %+v %v", pr, err)
	}
	none := func(context.Context) (map[string][]string, error) { return nil, nil }
	if _, err := s.Remove(ctx, im.Digest, none); err != nil {
		t.Errorf("rm by digest of an unused image: %v", err)
	}
	if l := leftover(t, s); len(l) > 0 {
		t.Errorf("rm left %v", l)
	}
}
