package auditlog

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRotation: the log keeps its current file and one old one; each
// rotation's head counts every entry lost so far, and none goes missing
// without being counted.
func TestRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.log")
	l := Log{Path: path, Max: 1000, Now: func() time.Time { return time.Unix(0, 0) }}
	ctx := context.Background()
	const n = 200
	for i := range n {
		if err := l.Append(ctx, fmt.Appendf(nil, `{"i":%d,"pad":"%s"}`, i, strings.Repeat("x", 40))); err != nil {
			t.Fatal(err)
		}
	}
	kept := 0
	for _, p := range []string{path + ".1", path} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 1000+100 {
			t.Errorf("%s: %d bytes", p, len(b))
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if _, ok := head([]byte(lines[0])); !ok {
			t.Errorf("%s starts with %q, not a head", p, lines[0])
		}
		kept += len(lines) - 1
	}
	lost, err := Lost(path)
	if err != nil {
		t.Fatal(err)
	}
	// The head of the current file counts what went before .1; .1's own
	// entries are kept.
	if b, _ := os.ReadFile(path); lost+int64(kept) != n || !strings.Contains(string(b), fmt.Sprintf("%d older entries are lost", lost)) {
		t.Errorf("lost %d + kept %d != %d appended", lost, kept, n)
	}
	t.Logf("lost %d, kept %d", lost, kept)
}

// TestConcurrent: writers in parallel lose no entry and leave whole lines.
func TestConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.log")
	l := Log{Path: path, Max: 1 << 20}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 50 {
				if err := l.Append(context.Background(), fmt.Appendf(nil, `{"w":%d,"i":%d}`, w, i)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	b, _ := os.ReadFile(path)
	if n := strings.Count(string(b), "\n"); n != 400 {
		t.Errorf("%d lines, want 400", n)
	}
}

// TestRefusesMultiLine: an entry is one line of JSON.
func TestRefusesMultiLine(t *testing.T) {
	l := Log{Path: filepath.Join(t.TempDir(), "m.log"), Max: 1 << 20}
	for _, e := range []string{"{\"a\":1}\n{\"b\":2}", "not json"} {
		if err := l.Append(context.Background(), []byte(e)); err == nil {
			t.Errorf("%q appended", e)
		}
	}
}

// TestRefusalFlood: a flood of refusals far past the log's size leaves
// every other entry (an --unsafe one, admin ones) in the current file,
// keeps the newest refusals, and counts the dropped ones in the head.
func TestRefusalFlood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.log")
	l := Log{Path: path, Max: 64 << 10, Refusal: func(e []byte) bool { return strings.Contains(string(e), `"v":"refused"`) }}
	ctx := context.Background()
	add := func(e string) {
		t.Helper()
		if err := l.Append(ctx, []byte(e)); err != nil {
			t.Fatal(err)
		}
	}
	pad := strings.Repeat("x", 4<<10)
	add(`{"v":"unsafe","i":"u0"}`)
	for i := range 5 {
		add(fmt.Sprintf(`{"v":"admin","i":"a%d"}`, i))
	}
	const n = 2000
	for i := range n {
		add(fmt.Sprintf(`{"v":"refused","i":"r%d","pad":"%s"}`, i, pad))
		if i == n/2 {
			add(`{"v":"unsafe","i":"u1"}`)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".1"); err == nil {
		t.Error("refusals rotated the log")
	}
	for _, want := range []string{`"i":"u0"`, `"i":"u1"`, `"i":"a0"`, `"i":"a4"`, fmt.Sprintf(`"i":"r%d"`, n-1)} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the log lost %s", want)
		}
	}
	h, _ := readHead(path)
	kept := int64(strings.Count(string(b), `"v":"refused"`))
	if int64(len(b)) > l.Max || h.Refusals+kept != n || h.Lost != h.Refusals || !strings.Contains(h.Note, "more refusals suppressed") {
		t.Errorf("%d bytes; head %+v; %d refusals kept of %d", len(b), h, kept, n)
	}
	t.Logf("%d refusals kept, head: %s", kept, h.Note)
}

// TestOthersStillRotate: with refusals under their half, the other
// entries rotate the log as before, and the head's count of dropped
// refusals carries over.
func TestOthersStillRotate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.log")
	l := Log{Path: path, Max: 4 << 10, Refusal: func(e []byte) bool { return strings.Contains(string(e), `"v":"refused"`) }}
	for i := range 200 {
		v := "admin"
		if i%4 == 0 {
			v = "refused"
		}
		if err := l.Append(context.Background(), fmt.Appendf(nil, `{"v":%q,"i":%d,"pad":"%s"}`, v, i, strings.Repeat("y", 100))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path + ".1"); err != nil {
		t.Errorf("other entries past Max did not rotate the log: %v", err)
	}
}
