package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// A drain's storage migration of a VM whose disks are overlays on stored
// images copies the top layers only, onto the target's copy of each base:
// the target's store must hold the images first (its receiver refuses an
// overlay whose base it lacks). The target's agent pulls them by digest
// once a placement names it as the target (prepareMoveIn) and publishes
// its store (publishImages); the source migrates once the target's host
// record lists them, up to imagesWait, after which the move counts as
// failed (the scheduler picks another target if one fits).

// imagesWait bounds a source's wait for its target's pull.
const imagesWait = 5 * time.Minute

// lacking is the first of rec's images h's record does not list; "" if it
// lists them all.
func lacking(h Host, rec VMRecord) string {
	for _, im := range rec.Images {
		if !slices.Contains(h.Images, im.Digest) {
			return im.Digest
		}
	}
	return ""
}

// imageWaits are the moves a source waits on, by VM and target, since when.
type imageWaits struct {
	mu    sync.Mutex
	since map[string]time.Time
}

// waited is how long vm's move to target has waited (0 the first time).
func (w *imageWaits) waited(vm, target string) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.since == nil {
		w.since = map[string]time.Time{}
	}
	k := vm + "\x00" + target
	t0, ok := w.since[k]
	if !ok {
		w.since[k] = time.Now()
		return 0
	}
	return time.Since(t0)
}

// done forgets vm's waits.
func (w *imageWaits) done(vm string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.since {
		if strings.HasPrefix(k, vm+"\x00") {
			delete(w.since, k)
		}
	}
}

// targetImages says whether vm's move to h may start: while h lacks an
// image, why it waits (its status); once it waited too long, an error.
func (a *Agent) targetImages(rec VMRecord, h Host) (why string, err error) {
	missing := lacking(h, rec)
	if missing == "" {
		a.waits.done(rec.Name)
		return "", nil
	}
	if d := a.waits.waited(rec.Name, h.Name); d > imagesWait {
		a.waits.done(rec.Name)
		return "", fmt.Errorf("%s does not hold image %s after %s (its agent's log says why its pull failed)", h.Name, missing, imagesWait)
	}
	return fmt.Sprintf("drain: to %s once its store holds image %s (it pulls it)", h.Name, missing), nil
}

// prepareMoveIn pulls the images of a VM a drain moves here that this
// host's store lacks, before the source migrates it; a failure is logged
// and tried again, spaced (the source's wait is bounded).
func (a *Agent) prepareMoveIn(ctx context.Context, rec VMRecord) {
	if len(rec.Images) == 0 || !a.retry.ready(rec.Name) {
		return
	}
	if err := a.ensureImages(ctx, rec); err != nil {
		d := a.retry.failed(rec.Name)
		a.Log.Warn("drain: pulling the images of a VM moving here", "vm", rec.Name, "next try in", d, "err", err)
		return
	}
	a.retry.succeeded(rec.Name)
}
