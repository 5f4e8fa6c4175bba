package consolelog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func tempLog(t *testing.T, keep int) Config {
	return Config{Path: filepath.Join(t.TempDir(), "console.log"), MaxBytes: MinMaxBytes, Keep: keep}
}

func TestReadBack(t *testing.T) {
	c := tempLog(t, 3)
	if tl, err := ReadBack(c, 100); err != nil || len(tl.Data) != 0 || tl.Cut || tl.End != (Position{}) {
		t.Errorf("no log: %+v, %v", tl, err)
	}
	w := openLog(c)
	w.write(patternAt(0, 6000))
	if tl, err := ReadBack(c, 1<<20); err != nil || !bytes.Equal(tl.Data, patternAt(0, 6000)) || tl.Cut || tl.End.off != 6000-MinMaxBytes {
		t.Errorf("all of 2 files: %d bytes, cut %v, end %d, %v", len(tl.Data), tl.Cut, tl.End.off, err)
	}
	w.write(patternAt(6000, 4000)) // 10000: Path.2, Path.1 full, Path 1808
	w.close()
	for _, limit := range []int64{0, 100, 1808, 1809, 3000, 10000, 1 << 20} {
		tl, err := ReadBack(c, limit)
		n := min(limit, 10000)
		if err != nil || !bytes.Equal(tl.Data, patternAt(10000-n, n)) {
			t.Errorf("ReadBack %d: %d bytes, %v; want the last %d", limit, len(tl.Data), err, n)
		}
		// the oldest slot taken: Path.2's first line may be cut.
		if !tl.Cut || tl.End.off != 1808 {
			t.Errorf("ReadBack %d: cut %v, end %d", limit, tl.Cut, tl.End.off)
		}
	}
}

// ReadBack while the log rotates under it gives bytes in order, each once.
func TestReadBackDuringFlood(t *testing.T) {
	fifo, c := setup(t, MinMaxBytes, 3)
	done := start(context.Background(), fifo, c, 10*time.Second)
	go func() {
		if err := flood(fifo, 8<<20); err != nil {
			t.Error(err)
		}
	}()
	reads, rotating := 0, true
	for rotating {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			rotating = false
		default:
		}
		tl, err := ReadBack(c, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if !isPattern(tl.Data) {
			t.Fatalf("read back %d bytes, not a run of the bytes written", len(tl.Data))
		}
		reads++
	}
	t.Logf("%d reads", reads)
}

// isPattern says whether b is a slice of the pattern.
func isPattern(b []byte) bool {
	for a := range 8 {
		if len(b) < a+8 {
			return len(b) == 0
		}
		if off := int64(binary.BigEndian.Uint64(b[a:]))*8 - int64(a); off >= 0 && bytes.Equal(b, patternAt(off, int64(len(b)))) {
			return true
		}
	}
	return false
}

// stepper drives a follower by hand, and checks it has seen all that was
// written, exactly once.
type stepper struct {
	t         *testing.T
	fl        *follower
	got, want []byte
}

func newStepper(t *testing.T, c Config, from Position) *stepper {
	s := &stepper{t: t}
	s.fl = &follower{c: c, pos: from, buf: make([]byte, bufSize), fn: func(b []byte) { s.got = append(s.got, b...) }}
	t.Cleanup(s.fl.close)
	return s
}

// wrote notes b as written, steps, and checks that the step saw exactly b
// (and what was written since the last check).
func (s *stepper) wrote(b []byte) {
	s.t.Helper()
	s.want = append(s.want, b...)
	s.fl.step()
	if !bytes.Equal(s.got, s.want) {
		s.t.Fatalf("followed %d bytes, want the %d written", len(s.got), len(s.want))
	}
	s.got, s.want = s.got[:0], s.want[:0] // checked
}

// Up to Keep rotations between two polls lose nothing: with Keep 1, the
// file rotated away is still read (held open).
func TestFollowRotations(t *testing.T) {
	for _, keep := range []int{1, 2, 3} {
		c := tempLog(t, keep)
		w := openLog(c)
		s := newStepper(t, c, Position{})
		s.wrote(nil)
		r := rand.New(rand.NewPCG(uint64(keep), 1))
		var off int64
		for range 300 {
			b := patternAt(off, 1+r.Int64N(int64(keep+1)*c.MaxBytes-w.size))
			w.write(b)
			off += int64(len(b))
			s.wrote(b)
		}
		w.close()
		if w.err != nil {
			t.Fatal(w.err)
		}
	}
}

func TestReadBackThenFollow(t *testing.T) {
	c := tempLog(t, 2)
	w := openLog(c)
	defer w.close()
	w.write(patternAt(0, 5000))
	tl, err := ReadBack(c, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	b := patternAt(5000, 6000) // 2 rotations
	w.write(b)
	s := newStepper(t, c, tl.End)
	s.wrote(b)
	// A log truncated (started anew) is read from its start.
	w.close()
	if err := os.WriteFile(c.Path, []byte("new run\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.wrote([]byte("new run\n"))
}

// Follow a log as Run writes it, the writer paced so that no more than a
// file's worth is unread at any time.
func TestFollowRun(t *testing.T) {
	fifo, c := setup(t, 16<<10, 2)
	done := start(context.Background(), fifo, c, 10*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []byte
	var seen atomic.Int64
	followed := make(chan error, 1)
	go func() {
		followed <- follow(ctx, c, Position{}, time.Millisecond, func(b []byte) {
			got = append(got, b...)
			seen.Add(int64(len(b)))
		})
	}()
	w := openWriter(t, fifo)
	const total = 2 << 20
	r := rand.New(rand.NewPCG(3, 4))
	var off int64
	for off < total {
		n := min(1+r.Int64N(4096), total-off)
		if _, err := w.Write(patternAt(off, n)); err != nil {
			t.Fatal(err)
		}
		off += n
		for off-seen.Load() > c.MaxBytes/2 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	w.Close()
	if err := waitRun(t, done, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for t0 := time.Now(); seen.Load() < total && time.Since(t0) < 5*time.Second; {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-followed; !errors.Is(err, context.Canceled) {
		t.Errorf("follow: %v", err)
	}
	if !bytes.Equal(got, patternAt(0, total)) {
		t.Errorf("followed %d bytes, not the %d written", len(got), total)
	}
}
