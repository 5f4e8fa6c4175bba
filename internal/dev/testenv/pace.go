package testenv

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A guest under TCG runs as fast as the host lets it: a wait sized for a
// quiet 2-core host fails on a loaded one (a counter wait of 30 s right
// after a reboot failed at load 12-24, and passed alone in 45 s). A
// GuestWait scales its bound by the host's slowness, read again at every
// poll so that load arriving mid-wait counts, and remembers how long
// earlier waits of its kind took, so that a timeout can say what it waited
// for and how that compares.

// maxSlowness caps the scaling: a guest that is truly stuck still fails,
// after at most this many times its quiet-host bound.
const maxSlowness = 8

// waitHistory is how long the finished waits of each kind took in this
// test process (one host per process: the figures describe that host).
var waitHistory = struct {
	sync.Mutex
	took map[string][]time.Duration
}{took: map[string][]time.Duration{}}

// GuestWait is one bounded wait on a guest (see StartGuestWait).
type GuestWait struct {
	Kind  string        // what is awaited: "VMSUP-COUNTER in console.log", "the counter moves"
	Base  time.Duration // the bound on a quiet host
	start time.Time
	slow  float64 // the largest slowness seen during the wait
}

// StartGuestWait begins a wait of the given kind whose bound on a quiet
// host is base.
func StartGuestWait(kind string, base time.Duration) *GuestWait {
	return &GuestWait{Kind: kind, Base: base, start: time.Now(), slow: Slowness()}
}

// Bound is the wait's current bound: Base times the largest slowness seen
// since it began.
func (w *GuestWait) Bound() time.Duration {
	return time.Duration(float64(w.Base) * w.slow)
}

// Expired reads the host's slowness again and says whether the wait has
// run past its bound.
func (w *GuestWait) Expired() bool {
	w.slow = max(w.slow, Slowness())
	return time.Since(w.start) > w.Bound()
}

// Done records how long the wait took, for later waits' messages.
func (w *GuestWait) Done() time.Duration {
	d := time.Since(w.start)
	waitHistory.Lock()
	waitHistory.took[w.Kind] = append(waitHistory.took[w.Kind], d)
	waitHistory.Unlock()
	return d
}

// Explain says, for a timeout message, how long the wait ran, how its bound
// was sized, and how long earlier waits of its kind took.
func (w *GuestWait) Explain() string {
	s := fmt.Sprintf("waited %s for %s (bound %s: %s on a quiet host x slowness %.1f; load now %s on %d CPUs)",
		time.Since(w.start).Round(100*time.Millisecond), w.Kind, w.Bound().Round(100*time.Millisecond), w.Base,
		w.slow, loadString(), runtime.NumCPU())
	waitHistory.Lock()
	took := slices.Clone(waitHistory.took[w.Kind])
	waitHistory.Unlock()
	if len(took) == 0 {
		return s + "; no earlier wait of this kind in this run"
	}
	slices.Sort(took)
	return s + fmt.Sprintf("; %d earlier waits of this kind took %s / %s / %s (min / median / max)", len(took),
		took[0].Round(100*time.Millisecond), took[len(took)/2].Round(100*time.Millisecond),
		took[len(took)-1].Round(100*time.Millisecond))
}

// GuestBound is the bound a wait sized base on a quiet host gets now: for
// a context deadline or a single timeout that cannot poll.
func GuestBound(base time.Duration) time.Duration {
	return time.Duration(float64(base) * Slowness())
}

// Slowness is how many times slower than a quiet host this one runs a
// guest now: the 1-minute load average per CPU, at least 1, at most
// maxSlowness.
func Slowness() float64 {
	load, err := load1()
	if err != nil {
		return 1
	}
	return min(max(1, load/float64(runtime.NumCPU())), maxSlowness)
}

func load1() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}

func loadString() string {
	if l, err := load1(); err == nil {
		return strconv.FormatFloat(l, 'f', 1, 64)
	}
	return "unknown"
}
