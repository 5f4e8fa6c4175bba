package consolelog

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

// clock is a writer's clock that the test moves.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// lineTimes is ReadBack's lines with the time of each line's end.
func lineTimes(t *testing.T, c Config) map[string]time.Time {
	t.Helper()
	tl, err := ReadBack(c, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	off := int64(0)
	for _, l := range bytes.SplitAfter(tl.Data, []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		out[strings.TrimSuffix(string(l), "\n")] = TimeAt(tl.Times, off+int64(len(l))-1)
		off += int64(len(l))
	}
	return out
}

// TestTimes: each line read back has the time it was written, to within
// timesEvery, across rotations; an index that is not its file's is not
// believed.
func TestTimes(t *testing.T) {
	c := tempLog(t, 3)
	clk := &clock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)}
	w := openLog(c)
	w.now = clk.now
	t0 := clk.t
	write := func(s string, after time.Duration) {
		clk.t = clk.t.Add(after)
		w.write([]byte(s))
	}
	write("one\n", 0)
	write("two\n", 50*time.Millisecond) // within timesEvery: one's time
	write("thr", time.Second)
	write("ee\n", time.Second) // a line's time is that of its end
	write(strings.Repeat("x", MinMaxBytes-20)+"\n", time.Second)
	write("after rotation\n", time.Second)
	w.close()
	want := map[string]time.Time{"one": t0, "two": t0, "three": t0.Add(2050 * time.Millisecond),
		strings.Repeat("x", MinMaxBytes-20): t0.Add(3050 * time.Millisecond), "after rotation": t0.Add(4050 * time.Millisecond)}
	got := lineTimes(t, c)
	for l, wt := range want {
		if !got[l].Equal(wt) {
			t.Errorf("line %.10q: time %v, want %v", l, got[l], wt)
		}
	}
	if len(Files(c)) != 2 {
		t.Fatalf("files %v: the test wants a rotation", Files(c))
	}

	// A file put in the log's place (another inode) has no times.
	b, _ := os.ReadFile(c.Path)
	os.Remove(c.Path)
	os.WriteFile(c.Path, b, 0o600)
	if got := lineTimes(t, c)["after rotation"]; !got.IsZero() {
		t.Errorf("a replaced file's line has the time %v of the old file's index", got)
	}
}

// TestTimesBudget: a guest writing a byte at a time for long gets coarser
// times, and the index stays within a quarter of its file.
func TestTimesBudget(t *testing.T) {
	c := Config{Path: tempLog(t, 2).Path, MaxBytes: 64 << 10, Keep: 2}
	clk := &clock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)}
	w := openLog(c)
	w.now = clk.now
	for range 60000 {
		clk.t = clk.t.Add(time.Second)
		w.write([]byte("."))
	}
	w.close()
	fi, _ := os.Stat(c.Path)
	ti, err := os.Stat(timesPath(c.Path))
	if err != nil || ti.Size() > max(timesFloor, fi.Size()/4)+20 {
		t.Errorf("index of %v bytes for a file of %d: want at most a quarter (%v)", ti.Size(), fi.Size(), err)
	}
	tl, _ := ReadBack(c, 1<<20)
	if last := TimeAt(tl.Times, int64(len(tl.Data))-1); clk.t.Sub(last) > time.Hour || last.After(clk.t) {
		t.Errorf("the last byte's time %v, written at %v: too coarse", last, clk.t)
	}
}
