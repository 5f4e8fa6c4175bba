package logs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/units"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func entry(s int, msg string) units.Entry {
	return units.Entry{Time: at(s), Unit: "vmsup-web.service", Message: msg, Cursor: msg}
}

func console(s int, text string) Line {
	l := Line{Source: "console", Text: text}
	if s >= 0 {
		l.Time = at(s)
	}
	return l
}

func TestMerge(t *testing.T) {
	journal := func(s int, msg string) Line { return Line{Time: at(s), Source: "vmsup-web.service", Text: msg} }
	for _, c := range []struct {
		name    string
		entries []units.Entry
		console []Line
		since   time.Time
		want    []Line
	}{
		{name: "console after the last start, later messages by time",
			entries: []units.Entry{entry(1, "Started vmsup: web"), entry(2, "Stopped"), entry(3, "Started vmsup: web"), entry(6, "stop requested")},
			console: []Line{console(4, "boot"), console(7, "login:")},
			want: []Line{journal(1, "Started vmsup: web"), journal(2, "Stopped"), journal(3, "Started vmsup: web"),
				console(4, "boot"), journal(6, "stop requested"), console(7, "login:")}},
		{name: "console lines of unknown time stay together",
			entries: []units.Entry{entry(1, "Started vmsup: web"), entry(5, "later")},
			console: []Line{console(-1, "a"), console(-1, "b")},
			want:    []Line{journal(1, "Started vmsup: web"), console(-1, "a"), console(-1, "b"), journal(5, "later")}},
		{name: "no start: the console after everything",
			entries: []units.Entry{entry(1, "something")},
			console: []Line{console(0, "boot")},
			want:    []Line{journal(1, "something"), console(0, "boot")}},
		{name: "console lines before since are left out",
			console: []Line{console(1, "old"), console(-1, "untimed"), console(5, "new")}, since: at(3),
			want: []Line{console(-1, "untimed"), console(5, "new")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got []Line
			merge(c.entries, c.console, c.since, func(l Line) { got = append(got, l) })
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("merge (-want +got):\n%s", diff)
			}
		})
	}
}

// standIn is a real Env on a state root of its own whose journal (systemd's)
// has the given entries; following it gives follow and then waits for the
// end.
type standIn struct {
	*machine.Env
	entries []units.Entry
	follow  []units.Entry
	asked   []units.JournalOptions
}

func newStandIn(t *testing.T, entries ...units.Entry) *standIn {
	t.Helper()
	env, err := machine.New(machine.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	return &standIn{Env: env, entries: entries}
}

func (h *standIn) UnitJournal(ctx context.Context, o units.JournalOptions, fn func(units.Entry)) error {
	h.asked = append(h.asked, o)
	if !o.Follow {
		for _, e := range h.entries {
			fn(e)
		}
		return nil
	}
	for _, e := range h.follow {
		fn(e)
	}
	<-ctx.Done()
	return nil
}

func TestRead(t *testing.T) {
	h := newStandIn(t, entry(1, "Started vmsup: web"))
	ctx := context.Background()
	if err := Read(ctx, h, "web", Options{}, func(Line) {}); !errors.Is(err, machine.ErrNotFound) {
		t.Errorf("Read of an unknown VM = %v", err)
	}
	if err := Read(ctx, h, "a/b", Options{}, func(Line) {}); err == nil {
		t.Error("Read of an invalid name passed")
	}
	p := h.State().Paths("web")
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// No console log yet: the journal alone.
	var got []Line
	if err := Read(ctx, h, "web", Options{}, func(l Line) { got = append(got, l) }); err != nil || len(got) != 1 {
		t.Fatalf("Read = %v, %v", got, err)
	}
	if err := os.WriteFile(p.ConsoleLog, []byte("boot\r\nlogin: "), 0o644); err != nil {
		t.Fatal(err)
	}
	got = nil
	if err := Read(ctx, h, "web", Options{}, func(l Line) { got = append(got, l) }); err != nil {
		t.Fatal(err)
	}
	want := []string{"vmsup-web.service: Started vmsup: web", "console: boot", "console: login: "}
	if diff := cmp.Diff(want, texts(got)); diff != "" {
		t.Errorf("Read (-want +got):\n%s", diff)
	}
	if u := h.asked[0].Units; len(u) != 3 || u[0] != "vmsup-web.service" {
		t.Errorf("journal asked for units %q", u)
	}
}

// TestReadFollow: new console lines and journal messages follow what was
// read back; the journal is followed from the last message read.
func TestReadFollow(t *testing.T) {
	h := newStandIn(t, entry(1, "Started vmsup: web"))
	h.follow = []units.Entry{entry(9, "stop requested")}
	p := h.State().Paths("web")
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.ConsoleLog, []byte("boot\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	var got []Line
	done := make(chan error, 1)
	go func() {
		done <- Read(ctx, h, "web", Options{Follow: true}, func(l Line) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, l)
			if l.Text == "login:" {
				cancel()
			}
		})
	}()
	time.Sleep(200 * time.Millisecond)
	f, err := os.OpenFile(filepath.Clean(p.ConsoleLog), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("login:\r\npartial")
	f.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]bool{}
	for _, s := range texts(got) {
		seen[s] = true
	}
	for _, s := range []string{"vmsup-web.service: Started vmsup: web", "console: boot", "vmsup-web.service: stop requested", "console: login:"} {
		if !seen[s] {
			t.Errorf("%q not shown; got %q", s, texts(got))
		}
	}
	if seen["console: partial"] {
		t.Error("a line the guest has not ended was shown while following")
	}
	if o := h.asked[len(h.asked)-1]; !o.Follow || o.AfterCursor != "Started vmsup: web" {
		t.Errorf("journal followed with %+v", o)
	}
}

func texts(ls []Line) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Source+": "+l.Text)
	}
	return out
}
