package fleet

import (
	"sync"
	"time"
)

// Retry spacing for a VM whose start, apply or migration failed: the
// first retry after firstRetry, each next one twice as late, up to
// maxRetry. A drain whose target agent died retries within seconds (to
// another host if one fits); a spec its host refuses is not retried in a
// tight loop.
const (
	firstRetry = time.Second
	maxRetry   = 30 * time.Second
)

// retries remembers, per VM, when it may be tried again. The zero value is
// ready; it is safe for concurrent use.
type retries struct {
	mu    sync.Mutex
	byVM  map[string]retry
	clock func() time.Time // nil: time.Now
}

type retry struct {
	next  time.Time
	delay time.Duration
}

func (r *retries) now() time.Time {
	if r.clock != nil {
		return r.clock()
	}
	return time.Now()
}

// failed records a failure of vm: the next try waits twice as long as the
// one before (firstRetry the first time).
func (r *retries) failed(vm string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byVM == nil {
		r.byVM = map[string]retry{}
	}
	d := firstRetry
	if prev, ok := r.byVM[vm]; ok {
		d = min(2*prev.delay, maxRetry)
	}
	r.byVM[vm] = retry{next: r.now().Add(d), delay: d}
	return d
}

// ready reports whether vm may be tried now.
func (r *retries) ready(vm string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.byVM[vm]
	return !ok || !r.now().Before(rt.next)
}

// succeeded forgets vm's failures.
func (r *retries) succeeded(vm string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byVM, vm)
}
