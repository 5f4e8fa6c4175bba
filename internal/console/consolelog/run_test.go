package consolelog

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// setup makes a FIFO and a log in a temporary directory.
func setup(t *testing.T, maxBytes int64, keep int) (string, Config) {
	t.Helper()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "console.fifo")
	if err := MakeFIFO(fifo, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	return fifo, Config{Path: filepath.Join(dir, "console.log"), MaxBytes: maxBytes, Keep: keep}
}

func start(ctx context.Context, fifo string, c Config, firstWriter time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() { done <- Run(ctx, fifo, c, firstWriter) }()
	return done
}

func waitRun(t *testing.T, done <-chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("Run still running after %s", d)
		return nil
	}
}

// openWriter opens the FIFO for writing, once the logger reads it (as
// QEMU's blocking open would; non-blocking here, so that a broken logger
// fails the test rather than hangs it).
func openWriter(t *testing.T, fifo string) *os.File {
	t.Helper()
	w, err := tryOpenWriter(fifo)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func tryOpenWriter(fifo string) (*os.File, error) {
	for t0 := time.Now(); ; time.Sleep(time.Millisecond) {
		w, err := os.OpenFile(fifo, os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0)
		if !errors.Is(err, syscall.ENXIO) || time.Since(t0) > 5*time.Second {
			return w, err // ENXIO: no reader yet
		}
	}
}

// flood writes total bytes of the pattern to the FIFO as fast as it can,
// in writes of random sizes, and closes it.
func flood(fifo string, total int64) error {
	w, err := tryOpenWriter(fifo)
	if err != nil {
		return err
	}
	defer w.Close()
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 100<<10)
	for off := int64(0); off < total; {
		n := min(1+r.Int64N(int64(len(buf))), total-off)
		pattern(buf[:n], off)
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

func TestFlood(t *testing.T) {
	fifo, c := setup(t, 64<<10, 2)
	done := start(context.Background(), fifo, c, 10*time.Second)
	const total = 20<<20 + 12345
	if err := flood(fifo, total); err != nil {
		t.Fatal(err)
	}
	if err := waitRun(t, done, 10*time.Second); err != nil {
		t.Fatalf("Run at EOF: %v", err)
	}
	got := readLog(t, c)
	if int64(len(got)) <= int64(c.Keep-1)*c.MaxBytes {
		t.Errorf("log of %d bytes: the older files are not full", len(got))
	}
	if !bytes.Equal(got, patternAt(total-int64(len(got)), int64(len(got)))) {
		t.Errorf("the log's %d bytes are not the last ones written", len(got))
	}
}

// QEMU's open of the FIFO blocks until the logger reads it, even if it
// came first.
func TestWriterFirst(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 2)
	wrote := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(fifo, os.O_WRONLY|os.O_APPEND, 0) // blocking, as QEMU's
		if err == nil {
			_, err = w.Write([]byte("early\n"))
			w.Close()
		}
		wrote <- err
	}()
	time.Sleep(100 * time.Millisecond)
	done := start(context.Background(), fifo, c, 10*time.Second)
	if err := waitRun(t, done, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if got := readLog(t, c); string(got) != "early\n" {
		t.Errorf("log: %q", got)
	}
}

func TestEOFWithoutData(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 2)
	done := start(context.Background(), fifo, c, 10*time.Second)
	openWriter(t, fifo).Close()
	if err := waitRun(t, done, 5*time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if b, err := os.ReadFile(c.Path); err != nil || len(b) != 0 {
		t.Errorf("log: %q, %v; want it empty", b, err)
	}
}

func TestCancelWaiting(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := start(ctx, fifo, c, 0)
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Run returned with no writer yet: %v", err)
	default:
	}
	t0 := time.Now()
	cancel()
	err := waitRun(t, done, time.Second)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want ctx's error", err)
	}
	t.Logf("returned %s after the cancel", time.Since(t0))
}

func TestFirstWriterTimeout(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 2)
	t0 := time.Now()
	err := waitRun(t, start(context.Background(), fifo, c, 200*time.Millisecond), 2*time.Second)
	if d := time.Since(t0); !errors.Is(err, os.ErrDeadlineExceeded) || d < 200*time.Millisecond || d > time.Second {
		t.Errorf("Run: %v after %s; want a deadline error after 200ms", err, d)
	}
}

func TestCancelCopying(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := start(ctx, fifo, c, 10*time.Second)
	w := openWriter(t, fifo)
	defer w.Close()
	if _, err := w.Write([]byte("login: ")); err != nil {
		t.Fatal(err)
	}
	for t0 := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(c.Path); string(b) == "login: " {
			break // written as it came, no newline needed
		}
		if time.Since(t0) > 5*time.Second {
			t.Fatal("the prompt did not reach the log")
		}
	}
	cancel()
	if err := waitRun(t, done, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want ctx's error", err)
	}
}

func TestAppend(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 2)
	if err := os.WriteFile(c.Path, []byte("run 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	done := start(context.Background(), fifo, c, 10*time.Second)
	w := openWriter(t, fifo)
	w.Write([]byte("run 2\n"))
	w.Close()
	if err := waitRun(t, done, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := readLog(t, c); string(got) != "run 1\nrun 2\n" {
		t.Errorf("log: %q", got)
	}
}

// A log from a run with larger bounds, or from before the logger, is
// brought within them when Run starts.
func TestStartOversize(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 3)
	files := map[string][]byte{
		c.Path + ".1": patternAt(0, 9000),
		c.Path:        patternAt(9000, MinMaxBytes+100),
		c.Path + ".3": []byte("stale"),
		c.Path + ".4": []byte("stale"),
	}
	for n, b := range files {
		if err := os.WriteFile(n, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	done := start(context.Background(), fifo, c, 10*time.Second)
	w := openWriter(t, fifo)
	w.Write([]byte("new"))
	w.Close()
	if err := waitRun(t, done, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	want := append(patternAt(9000-MinMaxBytes, MinMaxBytes), patternAt(9000+100, MinMaxBytes)...)
	if got := readLog(t, c); !bytes.Equal(got, append(want, "new"...)) {
		t.Errorf("log of %d bytes, want the last MaxBytes of each old file and the new", len(got))
	}
	ents, _ := os.ReadDir(filepath.Dir(c.Path))
	if len(ents) != 6 { // the FIFO, 3 files, the lock, the current file's times (the trimmed ones' went with them)
		t.Errorf("in the directory: %v", ents)
	}
}

func TestKeepOne(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 1)
	done := start(context.Background(), fifo, c, 10*time.Second)
	w := openWriter(t, fifo)
	w.Write(patternAt(0, 10000))
	w.Close()
	if err := waitRun(t, done, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := readLog(t, c); !bytes.Equal(got, patternAt(2*MinMaxBytes, 10000-2*MinMaxBytes)) {
		t.Errorf("log of %d bytes, want the last %d", len(got), 10000-2*MinMaxBytes)
	}
}

func TestNotFIFO(t *testing.T) {
	_, c := setup(t, MinMaxBytes, 2)
	if err := Run(context.Background(), c.Path, c, time.Second); err == nil {
		t.Error("Run on a missing FIFO: no error")
	}
	os.WriteFile(c.Path+".in", nil, 0o600)
	if err := Run(context.Background(), c.Path+".in", c, time.Second); err == nil {
		t.Error("Run on a regular file: no error")
	}
}

// TestNewRun: a new run starts a new current file, the last run's kept as
// Path.1; and two loggers of one log write one after the other (the lock).
func TestNewRun(t *testing.T) {
	dir := t.TempDir()
	c := Config{Path: filepath.Join(dir, "console.log"), MaxBytes: MinMaxBytes, Keep: 2}
	if err := os.WriteFile(c.Path, []byte("old run\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := StartRun(c); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "a.fifo")
	if err := MakeFIFO(fifo, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	done := start(context.Background(), fifo, c, 10*time.Second)
	w := openWriter(t, fifo)
	w.Write([]byte("new run\n"))

	// A second logger of the same log (a local migration's other QEMU)
	// waits for the first to finish.
	c2 := c
	fifo2 := filepath.Join(dir, "b.fifo")
	if err := MakeFIFO(fifo2, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	done2 := start(context.Background(), fifo2, c2, 10*time.Second)
	w2 := openWriter(t, fifo2)
	w2.Write([]byte("second\n"))
	w2.Close()
	time.Sleep(300 * time.Millisecond)
	w.Write([]byte("more\n"))
	w.Close()
	if err := waitRun(t, done, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitRun(t, done2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	cur, _ := os.ReadFile(c.Path)
	old, _ := os.ReadFile(c.Path + ".1")
	if string(cur) != "new run\nmore\nsecond\n" || string(old) != "old run\n" {
		t.Errorf("current %q, previous %q", cur, old)
	}
}

// TestServe: a FIFO held open for reading and writing (as systemd's socket
// holds it) never reaches EOF: Serve copies what is there, appending to
// the log, and ends after idle without data; what comes after waits in the
// FIFO for the next Serve.
func TestServe(t *testing.T) {
	fifo, c := setup(t, 64<<10, 2)
	held, err := os.OpenFile(fifo, os.O_RDWR|syscall.O_NONBLOCK, 0) // systemd's
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ctx := context.Background()
	for i, line := range []string{"one\n", "login: "} {
		if _, err := held.WriteString(line); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := Serve(ctx, held, c, 100*time.Millisecond); err != nil {
			t.Fatalf("serve %d: %v", i, err)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("serve %d took %s with an idle of 100ms", i, d)
		}
	}
	if got := string(readLog(t, c)); got != "one\nlogin: " {
		t.Errorf("log %q", got)
	}
	if err := Serve(ctx, held, c, 0); err == nil {
		t.Error("Serve with no idle bound: no error")
	}
}
